"""CUDA graph replays: the probe around a graph-replay entry, with CUDA events on each replay's stream.

Why: SGLang decodes, and verifies the draft, by replaying CUDA graphs captured per shape (SGLang 0.5.23:
``DecodeCudaGraphRunner.execute`` calls ``self.backend.replay(shape_key, forward_batch)``, the backend being
``FullCudaGraphBackend``, ``BreakableCudaGraphBackend`` or ``TcPiecewiseCudaGraphBackend``). Inside a graph no
Python runs per kernel, so the Engram host-table read, a kernel in the graph, is invisible to the eager probe
(:mod:`.gpu` records nothing while a graph is captured, and a replay runs no wrapped call). The one Python call
left per step is the replay itself; wrapping it gives one ring slot per replay:

- the gather size is the replayed graph's *token count* (:func:`replay_shape`: the shape key's size, times the
  runner's tokens per request where the key counts requests), and the slot's target word carries the graph
  flag and the shape key (:func:`.ring.target_word`), so the record says it was a replay and of which graph;
- a CUDA event is recorded on the current (replay) stream after each replay, and one before it where needed (next
  paragraph); a reader thread (``sgl-seat-probe-graph``) queries them off the hot path and publishes into the same
  ring's GPU state and side area as :mod:`.gpu` does: *queued* until the replay's start is known, *started* (with
  that moment) until the end event completes, then *done*. A replay whose end never comes is "in flight on the
  GPU: graph replay, N tokens" (``core/detect/fetchstall.py``) and names its rank;
- while a graph is being captured (the capture hooks' count, or ``torch.cuda.is_current_stream_capturing()``)
  no event is recorded and the replay runs untimed: an event recorded then would belong to the captured graph.

One event per replay in steady state, two where needed. A replay records its start event only where the previous
timed replay on its stream has already been seen done by the reader (or none is queued there, or it was dropped).
Otherwise (the host runs ahead of the GPU: the previous replay on the stream is still queued or unresolved, the
usual case, since the reader polls every 20 ms) it records only its end event, and its start is bounded by the
previous replay's end on that stream, as :mod:`.gpu` bounds an eager call's ("the next call's start bound is when
the previous event completed"): it counts as *started* once the reader has seen that previous replay done, from
``max(its host launch, when that end was seen done)``. Why: the two records were most of the C path's cost (~2.4 us
added per replay with events against ~0.5 us host only on an H200, ``bench/gpu/results/2026-12-01-h200-graphs-run8-
graph_cost.json``; 2 us asked). Why it is safe for the in-flight rule (3 s): that start is never earlier than the host
launch nor than the previous replay's end, so an idle gap never ages a replay; work launched between two replays on
the stream that is not a replay (the sampling, the eager parts of a step) counts into the next replay's time, which is
milliseconds against 3 s; and the start is seen at the poll after the previous end, up to a poll period late. Where
the previous replay was dropped (a query failed), the next one has no start knowledge: it stays *queued* until its
own end completes (no start is invented). The hot path decides from cheap state only (whether the stream's last
queued replay is still unresolved), never a query. ``SGLSEAT_PROBE_GRAPH_START_EVENTS=always`` records both events
around every replay (the exact start; the bench's two-event arm); the timers count start events recorded
(``start_events``) and starts bounded by the previous end (``start_shared``). Events are plain (no timing: half the
record cost) unless ``SGLSEAT_PROBE_GRAPH_TIMING=1``; then times are the poll's (20 ms), which is nothing beside a
3 s threshold.

Two paths, as for the eager writer (:func:`.writer._native`): where the C writer builds, the wrapper is its
``GraphWrapper`` (``probe_native.c``) and, in a CUDA process, the timer is :class:`NativeReplayTimer`: the
capture test, the records (``cudaEventRecord`` on events of its own pool), the queue and the reader's queries
(``cudaEventQuery``, the GIL released) are C. Elsewhere the Python wrapper and :class:`ReplayTimer` below do the
same job. Why: the Python path added ~14 us per replay with events on an H200 (~4 us host only; the target is
2 us): the wrapper's own Python (the shape key's getattr chain through the runner, a target-word function call,
the argument tuple and dict), two records through Python functions and torch's record binding, and above all the
reader thread resolving every replay in Python while holding the GIL, which the replaying thread then waited for
(the reader's work per replay was the hot path's). Which path a process took: :func:`graph_path`.

Why a module of its own: replays are a different call shape (events around one launch, a shape key) from
the eager row fetch the writer and :mod:`.gpu` serve, and the installer only needs :func:`make_graph_wrapper`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import writer
from .gpu import EventTimer, ReaderLoop, _no_stream
from .guard import warn_once
from .ring import (
    _END_BITS,
    _END_MASK,
    _GPU_OFF,
    _GPU_OFF_AT,
    _LAP_MASK,
    _SLOT,
    _W_CALL,
    _W_END,
    _W_GPU,
    _W_START,
    GPU_DONE,
    GPU_NONE,
    GPU_QUEUED,
    GPU_STARTED,
    GRAPH_FLAG,
    GRAPH_KEY_MAX,
    GRAPH_KEY_SHIFT,
    HEADER_BYTES,
    SLOT_BYTES,
)
from .targets import GRAPH_MODE, TargetSpec, _size_position

ENV_GRAPH = "SGLSEAT_PROBE_GRAPH"  # auto (default: events where CUDA is initialised) | 0 (host timing only)
ENV_GRAPH_TIMING = "SGLSEAT_PROBE_GRAPH_TIMING"  # 1: timing events (start/end to microseconds); default 0
#: shared (default): a start event only where the stream's previous replay was seen done (else bounded by its end);
#: always: a start event before every replay (two events per replay, the exact start)
ENV_GRAPH_START_EVENTS = "SGLSEAT_PROBE_GRAPH_START_EVENTS"
START_SHARED, START_ALWAYS = "shared", "always"
__all__ = ["ENV_GRAPH", "ENV_GRAPH_START_EVENTS", "ENV_GRAPH_TIMING", "GRAPH_MODE", "START_ALWAYS", "START_SHARED",
           "NativeReplayTimer", "ReplayTimer", "disable_graph", "enable_graph", "enable_graph_native", "graph_path",
           "make_graph_wrapper", "make_runner_link", "replay_shape", "replay_timer", "start_events_mode"]
PREFILL_PAIRS = 256


def start_events_mode(value: str | None = None) -> str:
    """``always`` or ``shared`` (the default) from ``value`` or ``SGLSEAT_PROBE_GRAPH_START_EVENTS``; an unknown
    value is warned about once and taken as the default."""
    raw = (os.environ.get(ENV_GRAPH_START_EVENTS, "") if value is None else value).strip().lower()
    if raw in ("always", "two", "2", "both"):
        return START_ALWAYS
    if raw not in ("", "shared", "auto", "default", "one", "1"):
        warn_once("graph-start-events", f"{ENV_GRAPH_START_EVENTS}={raw!r} is not 'always' or 'shared': shared")
    return START_SHARED


def replay_shape(owner: Any, key: Any) -> tuple[int, int]:
    """(token count, shape key) of one replay of ``owner``'s graph for ``key``.

    ``key`` is SGLang's ``ShapeKey`` (``runner/shape_key.py``: ``size`` counts requests for ordinary decode and
    tokens for prefill and ragged verify) or a plain int. Where the backend knows its runner
    (``self._cuda_graph_runner``: set in each backend's ``__init__`` by SGLang 0.5.23, by a ``link`` target,
    :func:`make_runner_link`, on 0.5.17) and that runner captured per request, not
    ragged (``ragged_verify_mode`` false), the graph holds ``size x captured_req_width`` tokens: the draft's tokens
    per request in verify, 1 in plain decode (``decode_cuda_graph_runner.py``: ``padded_num_tokens = bs *
    self.captured_req_width``). Raises TypeError where the key has no integer size.
    """
    size = key if isinstance(key, int) and not isinstance(key, bool) else getattr(key, "size", None)
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"graph shape key {key!r} has no integer size")
    runner = getattr(owner, "_cuda_graph_runner", None)
    width = 1
    if runner is not None and not getattr(runner, "ragged_verify_mode", False):
        w = getattr(runner, "captured_req_width", 1)
        width = w if isinstance(w, int) and not isinstance(w, bool) and w > 0 else 1
    return size * width, size


def make_runner_link(fn: Callable[..., Any], spec: TargetSpec) -> Callable[..., Any]:
    """Wrap a graph backend's constructor ``fn(self, cuda_graph_runner, ...)`` (a ``link`` target) so that, after it
    returns, ``self._cuda_graph_runner`` is the argument ``spec.size_arg`` where the instance has none.

    Why: :func:`replay_shape` reads the runner there, and SGLang 0.5.17's ``FullCudaGraphBackend`` and
    ``BreakableCudaGraphBackend`` do not keep it (0.5.23's do: there the link leaves the instance as it is). Runs
    once per backend made, so plain Python is enough. No ring slot, no timing, no rehearsal gate: a constructor must
    never stall. A failure of the link itself (no such argument, an instance that refuses the attribute) is warned
    about once and the constructor's result returned; an exception of the constructor is its own and propagates.
    """
    pos, name = _size_position(fn, spec)
    label = spec.raw

    @functools.wraps(fn)
    def runner_link(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        try:
            owner = args[0]
            if getattr(owner, "_cuda_graph_runner", None) is None:
                if 0 <= pos < len(args):
                    runner = args[pos]
                elif name is not None and name in kwargs:
                    runner = kwargs[name]
                else:
                    raise LookupError(f"no argument {spec.size_arg!r} in this call")
                if runner is not None:
                    owner._cuda_graph_runner = runner
        except Exception as exc:
            warn_once(f"link:{label}", f"{label}: runner not linked, graph replays count requests "
                                       f"({type(exc).__name__}: {exc})")
        return out

    runner_link.__sgl_seat_probe__ = spec.name  # type: ignore[attr-defined]
    return runner_link


_PENDING, _SEEN_DONE, _DROPPED = 0, 1, 2  # a _Replay's state


class _Replay:
    """One timed replay in its stream's queue (ReplayTimer's; the C timer's gt_entry)."""

    __slots__ = ("b", "c", "ev0", "ev1", "prev", "seen", "state")

    def __init__(self, ev0: Any, ev1: Any, b: int, c: int, prev: _Replay | None) -> None:
        self.ev0, self.ev1, self.b, self.c = ev0, ev1, b, c
        self.prev = prev  # without a start event: the stream's previous replay, whose end bounds this one's start
        self.state = _PENDING  # then _SEEN_DONE, or _DROPPED (a query on its stream failed)
        self.seen = 0.0  # when its end was seen done (state _SEEN_DONE)

    def bound(self) -> float | None:
        """When the previous replay on the stream was seen done, where it was and this one has no start event."""
        p = self.prev
        return p.seen if p is not None and p.state == _SEEN_DONE else None


class ReplayTimer(EventTimer):
    """CUDA events around each replay on its stream, resolved into the ring by :meth:`poll`.

    ``event_factory`` makes one event; ``stream_key()`` names the current stream; ``record(event, key)`` records
    on it; ``query(event)`` says whether it completed; ``capturing()`` whether a graph is being captured;
    ``event_time(event)`` (optional) the wall time it completed. The hot path (:meth:`before`, :meth:`after`)
    pops pooled events and records them: no query, no synchronisation, no allocation once the pool is warm. An end
    event after every replay; a start event before it only where the previous timed replay on its stream was already
    seen done by the reader (or none is queued there), else its start is bounded by that replay's end (the module
    doc says why that is safe for the in-flight rule); ``start_events`` ``"always"``: a start event every replay.
    The reader thread is :class:`.gpu.ReaderLoop`'s.
    """

    thread_name = "sgl-seat-probe-graph"

    def __init__(self, event_factory: Callable[[], Any], capturing: Callable[[], bool], *, gpu_off: int,
                 nslots: int, poll_s: float = 0.02, clock: Callable[[], float] = time.time,
                 stream_key: Callable[[], Any] | None = None, record: Callable[[Any, Any], Any] | None = None,
                 query: Callable[[Any], bool] | None = None, thread_init: Callable[[], None] | None = None,
                 event_time: Callable[[Any], float | None] | None = None,
                 start_events: str = START_SHARED) -> None:
        super().__init__(event_factory, gpu_off=gpu_off, nslots=nslots, poll_s=poll_s, clock=clock, record=record,
                         query=query, thread_init=thread_init, event_time=event_time)
        self.capturing = capturing
        self.stream_key: Callable[[], Any] = stream_key if stream_key is not None else _no_stream
        # Per stream, replays in launch order.
        self._streams: dict[Any, collections.deque[_Replay]] = {}
        self.start_events_mode = start_events_mode(start_events)
        self._always = self.start_events_mode == START_ALWAYS
        self.recorded = 0  # replays timed (their end event recorded and queued)
        self.start_events = 0  # start events recorded
        self.start_shared = 0  # replays whose start is bounded by the previous replay's end (no start event)

    # -- hot path ------------------------------------------------------------------------------------
    def before(self) -> tuple[Any, Any, _Replay | None] | None:
        """(start event or None, the stream's key, the previous replay whose end bounds this one's start or None);
        None: this replay goes untimed (a capture in progress, too many unresolved replays, an error)."""
        try:
            if self._queued >= self._limit or self.capturing():
                return None
            key = self.stream_key()
            if not self._always:
                dq = self._streams.get(key)
                try:
                    prev = dq[-1] if dq is not None else None  # the stream's last replay, still unresolved
                except IndexError:  # the reader resolved it just now
                    prev = None
                if prev is not None:
                    self.start_shared += 1
                    return None, key, prev
            ev = self._free.pop() if self._free else self._factory()
            self._record(ev, key)
            self.start_events += 1
            return ev, key, None
        except Exception as exc:
            self.errors += 1
            warn_once("graph-record", f"cannot record a CUDA event before a graph replay ({type(exc).__name__}: {exc})")
            return None

    def after(self, started: tuple[Any, Any, Any], b: int, c: int) -> bool:
        """The end event after the replay in slot word ``b`` (call ``c``) on the start's stream, queued for the
        reader; False where it cannot be recorded (the slot then goes back to untimed)."""
        ev0, key, prev = started
        try:
            ev1 = self._free.pop() if self._free else self._factory()
            self._record(ev1, key)
        except Exception as exc:
            self.errors += 1
            if ev0 is not None:
                self._free.append(ev0)
            warn_once("graph-record", f"cannot record a CUDA event after a graph replay ({type(exc).__name__}: {exc})")
            return False
        q = self._streams.get(key)
        if q is None:
            q = self._streams[key] = collections.deque()
        # (prev may have been resolved meanwhile, the replay releasing the GIL: poll reads its state then)
        q.append(_Replay(ev0, ev1, b, c, prev if ev0 is None else None))
        self._queued += 1
        self.recorded += 1
        return True

    # -- reader ----------------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> int:
        """Publish what completed since the last poll; returns how many replays are still unresolved.

        Per stream, replays complete in launch order: each done one (its end event completed) gets *done*; the
        first one not done gets *started* once its start event completed or, without one, once the previous replay
        on the stream was seen done (from then: :class:`_Replay`.bound); the ones behind it stay *queued*.
        """
        q, d = writer._Q, writer._D
        t = self._clock() if now is None else now
        left = 0
        for dq in list(self._streams.values()):
            try:
                while dq:
                    r = dq[0]
                    if self._query(r.ev1):
                        bound = r.bound() if r.ev0 is None else None
                        start = self._when(r.ev0, t) if r.ev0 is not None else (t if bound is None else bound)
                        r.seen = self._when(r.ev1, t)
                        self._publish(q, d, r.b, r.c, GPU_DONE, start, r.seen)
                        r.state, r.prev = _SEEN_DONE, None  # (None: no chain of replays kept alive)
                        dq.popleft()
                        if r.ev0 is not None:
                            self._free.append(r.ev0)
                        self._free.append(r.ev1)
                        r.ev0 = r.ev1 = None
                        continue
                    if q is not None and q[r.b + _W_CALL] == r.c and q[r.b + _W_GPU] == GPU_QUEUED:
                        if r.ev0 is not None:
                            if self._query(r.ev0):
                                self._publish(q, d, r.b, r.c, GPU_STARTED, self._when(r.ev0, t), None)
                        else:
                            bound = r.bound()
                            if bound is not None:
                                self._publish(q, d, r.b, r.c, GPU_STARTED, bound, None)
                    if r.ev0 is None and r.prev is not None and r.prev.state != _PENDING:
                        r.prev = None  # its bound is used (or, dropped, there is none): no chain kept alive
                    break
            except Exception as exc:  # a query that fails: drop this stream's replays (untimed), never raise
                self.errors += 1
                warn_once("graph-query", f"cannot query a replay's CUDA event ({type(exc).__name__}: {exc})")
                for r in dq:
                    if q is not None and q[r.b + _W_CALL] == r.c:
                        q[r.b + _W_GPU] = GPU_NONE
                    r.state, r.prev = _DROPPED, None
                dq.clear()
            left += len(dq)
        self._queued = left
        return left

    def _when(self, ev: Any, t: float) -> float:
        if self._event_time is not None and ev is not None:
            with contextlib.suppress(Exception):
                at = self._event_time(ev)
                if at is not None:
                    return min(t, at)
        return t

    def _publish(self, q: memoryview[int] | None, d: memoryview[float] | None, b: int, c: int, state: int,
                 start: float, end: float | None) -> None:
        if q is None or d is None or q[b + _W_CALL] != c:
            return  # the slot was reused: nothing to publish
        g = self._gpu_word + 2 * ((b >> 3) - self._base)
        host = q[b + _W_START] / 1e9
        if q[b + _W_GPU] != GPU_STARTED:
            d[g] = max(host, start)  # the replay's work did not start before it was launched
        if end is not None:
            d[g + 1] = max(end, d[g])
        q[b + _W_GPU] = state


class NativeReplayTimer(ReaderLoop):
    """:class:`ReplayTimer`'s job done by the C writer (``probe_native.c``, "CUDA graph replays"): the C
    ``GraphWrapper`` records the events itself (an end event after every replay, a start event before it where
    ReplayTimer would record one; ``start_events`` ``"always"``: every replay) and queues them; :meth:`poll` (its
    reader thread) has the C side query them with the GIL released and publish what completed, with the same states
    and start bounds as ReplayTimer.poll.

    ``before``/``after`` are the same hot path for a Python wrapper (the fallback wrapper in a process whose timer is
    this one: the bench's Python arm). ``nat`` is the loaded C module; the addresses are the CUDA runtime's
    ``cudaEventRecord``, ``cudaEventQuery``, ``cudaEventCreateWithFlags`` and ``cudaStreamIsCapturing`` (0: no
    per-stream capture test), or a test's stand-ins; the stream is ``key_fn(key_arg)`` (``key_arg()`` first where
    callable), ``captures[0]`` the graph captures in progress (the capture hooks' count). The reader thread is
    :class:`.gpu.ReaderLoop`'s.
    """

    native = True
    thread_name = "sgl-seat-probe-graph"

    def __init__(self, nat: Any, captures: list[int], key_fn: Callable[[Any], Any], key_arg: Any, *, record: int,
                 query: int, create: int, capturing: int = 0, nslots: int, prefill: int = 0, poll_s: float = 0.02,
                 clock: Callable[[], float] = time.time, thread_init: Callable[[], None] | None = None,
                 start_events: str = START_SHARED) -> None:
        super().__init__(poll_s, clock, thread_init)
        self._nat = nat
        self.start_events_mode = start_events_mode(start_events)
        self.prefilled = int(nat.graph_setup(self, captures, key_fn, key_arg, record, query, create, capturing,
                                             nslots, prefill, self.start_events_mode == START_ALWAYS))

    def _stats(self) -> dict[str, int]:
        stats: dict[str, int] = self._nat.graph_stats()
        return stats

    @property
    def recorded(self) -> int:
        """Replays timed: their end event recorded and queued (the C side's count)."""
        return self._stats()["recorded"]

    @property
    def errors(self) -> int:
        return self._stats()["errors"]

    @property
    def start_events(self) -> int:
        """Start events recorded."""
        return self._stats()["start_events"]

    @property
    def start_shared(self) -> int:
        """Replays whose start is bounded by the previous replay's end on the stream (no start event)."""
        return self._stats()["start_shared"]

    def before(self) -> tuple[int, int, int] | None:
        """(stream, start event or 0, the previous entry whose end bounds the start or 0); None: untimed."""
        started: tuple[int, int, int] | None = self._nat.graph_before()
        return started

    def after(self, started: tuple[Any, Any, Any], b: int, c: int) -> bool:
        return bool(self._nat.graph_after(started[0], started[1], started[2], b, c))

    def poll(self, now: float | None = None) -> int:
        """Publish what completed since the last poll; returns how many replays are still unresolved."""
        return int(self._nat.graph_poll(self._clock() if now is None else now))

    def _busy(self) -> bool:
        return self._stats()["queued"] > 0

    def stop(self) -> None:
        super().stop()
        self._nat.graph_clear(self)  # the C wrapper records no more events for this timer


#: The process's replay timer (None: not decided yet or off); ``_DECIDED`` once the first replay decided it.
_TIMER: ReplayTimer | NativeReplayTimer | None = None
_DECIDED = False
_LOCK = threading.Lock()


def enable_graph(event_factory: Callable[[], Any], capturing: Callable[[], bool] = lambda: False, *,
                 poll_s: float = 0.02, start_thread: bool = True, stream_key: Callable[[], Any] | None = None,
                 record: Callable[[Any, Any], Any] | None = None, query: Callable[[Any], bool] | None = None,
                 thread_init: Callable[[], None] | None = None,
                 event_time: Callable[[Any], float | None] | None = None,
                 start_events: str | None = None) -> ReplayTimer | None:
    """Time graph replays with these event paths (the ring must exist; created if need be). Tests pass fakes;
    ``start_thread=False`` leaves resolving to explicit :meth:`ReplayTimer.poll` calls; ``start_events`` None:
    ``SGLSEAT_PROBE_GRAPH_START_EVENTS`` (:func:`start_events_mode`)."""
    global _TIMER, _DECIDED
    if not writer._ensure_ring() or writer._MM is None:
        return None
    gpu_off = _GPU_OFF.unpack_from(writer._MM, _GPU_OFF_AT)[0]
    if _TIMER is not None:
        _TIMER.stop()
    timer = ReplayTimer(event_factory, capturing, gpu_off=gpu_off, nslots=writer._MASK + 1, poll_s=poll_s,
                        stream_key=stream_key, record=record, query=query, thread_init=thread_init,
                        event_time=event_time, start_events=start_events_mode(start_events))
    if start_thread:
        timer.start()
    _TIMER, _DECIDED = timer, True
    return timer


def enable_graph_native(captures: list[int], key_fn: Callable[[Any], Any], key_arg: Any, *, record: int,
                        query: int, create: int, capturing: int = 0, poll_s: float = 0.02, prefill: int = 0,
                        start_thread: bool = True, start_events: str | None = None) -> NativeReplayTimer | None:
    """Time graph replays with the C writer's timer and these function addresses (tests pass ctypes callbacks);
    None where the C writer is not loaded or the ring cannot be made. ``start_events`` as :func:`enable_graph`'s."""
    global _TIMER, _DECIDED
    nat = writer._native()
    if nat is None or not writer._ensure_ring():
        return None
    if _TIMER is not None:
        _TIMER.stop()
    timer = NativeReplayTimer(nat, captures, key_fn, key_arg, record=record, query=query, create=create,
                              capturing=capturing, nslots=writer._MASK + 1, prefill=prefill, poll_s=poll_s,
                              start_events=start_events_mode(start_events))
    if start_thread:
        timer.start()
    _TIMER, _DECIDED = timer, True
    return timer


def graph_path() -> str:
    """Which path times this process's replays: "native" (the C wrapper and timer), "python", or where the C writer
    is loaded but the timer is Python's (or none) "native wrapper, python timer" / "native wrapper, host only"."""
    nat = writer._native()
    timer = _TIMER
    if nat is None:
        return "python" if timer is not None else "python, host only"
    if isinstance(timer, NativeReplayTimer):
        return "native"
    return "native wrapper, python timer" if timer is not None else "native wrapper, host only"


def disable_graph() -> None:
    """No replay timer, and none decided (the next replay decides again); tests."""
    global _TIMER, _DECIDED
    if _TIMER is not None:
        _TIMER.stop()
    _TIMER, _DECIDED = None, False


def replay_timer() -> ReplayTimer | NativeReplayTimer | None:
    return _TIMER


def _decide() -> ReplayTimer | NativeReplayTimer | None:
    """On the first replay (outside a capture): CUDA event paths where torch has initialised CUDA here, per
    ``SGLSEAT_PROBE_GRAPH`` (and ``SGLSEAT_PROBE_GRAPH_START_EVENTS``: :func:`start_events_mode`); else none
    (replays are timed on the host only). The C writer's timer where it is loaded and its CUDA round trip works
    (:func:`_native_timer`), else :class:`ReplayTimer`."""
    global _TIMER, _DECIDED
    with _LOCK:
        if _DECIDED:
            return _TIMER
        _DECIDED = True
        if os.environ.get(ENV_GRAPH, "auto").strip().lower() in ("0", "off", "false", "no"):
            return None
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_initialized():
                return None
            from . import gpu

            timing = os.environ.get(ENV_GRAPH_TIMING, "0").strip().lower() in ("1", "on", "true", "yes")
            how = os.environ.get(gpu.ENV_GPU_PATH, "").strip() or gpu.DEFAULT_GPU_PATH
            try:
                paths = gpu.cuda_paths(torch, how, timing)
            except Exception:
                paths = gpu.cuda_paths(torch, "method", timing)
            capturing = gpu._graph_capture_hooks(torch) or torch.cuda.is_current_stream_capturing
            if not writer._ensure_ring() or writer._MM is None:
                return None
            start_events = start_events_mode()  # SGLSEAT_PROBE_GRAPH_START_EVENTS
            if not timing and _NATIVE_ALLOWED:
                native_timer = _native_timer(torch, paths, capturing, start_events)
                if native_timer is not None:
                    native_timer.start()
                    _TIMER = native_timer
                    return _TIMER
            gpu_off = _GPU_OFF.unpack_from(writer._MM, _GPU_OFF_AT)[0]
            timer = ReplayTimer(paths.factory, capturing, gpu_off=gpu_off, nslots=writer._MASK + 1,
                                poll_s=gpu._gpu_poll_s(), stream_key=paths.stream_key, record=paths.record,
                                query=paths.query, thread_init=paths.thread_init, event_time=paths.event_time,
                                start_events=start_events)
            timer.prefill(min(2 * PREFILL_PAIRS, writer._MASK + 1))
            timer.start()
            _TIMER = timer
        except Exception as exc:
            warn_once("graph", f"graph replays not timed on the GPU ({type(exc).__name__}: {exc}); host timing only")
        return _TIMER


#: False: the Python timer even where the C writer is loaded (the bench's Python arm).
_NATIVE_ALLOWED = True


def _native_timer(torch: Any, paths: Any, capturing: Callable[[], bool],
                  start_events: str = START_SHARED) -> NativeReplayTimer | None:
    """The C writer's replay timer on the CUDA runtime's own functions, where the C writer is loaded, the capture
    test is the hooks' count (a list the C side reads) and the stream key the paths' builtin; None elsewhere or
    where an event made, recorded and queried through those addresses does not complete after a synchronize."""
    import ctypes

    from . import gpu

    nat = writer._native()
    lib = gpu.cudart(ctypes)
    if nat is None or lib is None or capturing is not gpu._graph_capturing or paths.fast_key is None:
        return None
    try:
        addr = {n: int(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0)
                for n in ("cudaEventRecord", "cudaEventQuery", "cudaEventCreateWithFlags", "cudaStreamIsCapturing")}
        if not all(addr.values()):
            return None
        key_fn, key_arg = paths.fast_key[0], paths.fast_key[2]  # the exact current stream, every replay
        stream = key_fn(key_arg() if callable(key_arg) else key_arg)
        ev = ctypes.c_void_p()
        create = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint)(
            addr["cudaEventCreateWithFlags"])
        record = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(addr["cudaEventRecord"])
        query = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(addr["cudaEventQuery"])
        status = ctypes.c_int(-1)
        is_capturing = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))(
            addr["cudaStreamIsCapturing"])
        if create(ctypes.byref(ev), 2) != 0 or record(ev, stream) != 0:
            return None
        torch.cuda.synchronize()
        if query(ev) != 0 or is_capturing(stream, ctypes.byref(status)) != 0 or status.value != 0:
            return None
        return NativeReplayTimer(nat, gpu._CAPTURES, key_fn, key_arg, record=addr["cudaEventRecord"],
                                 query=addr["cudaEventQuery"], create=addr["cudaEventCreateWithFlags"],
                                 # the hooks' count alone tells a capture (torch.cuda.graph and CUDAGraph's
                                 # capture_begin/end, as the eager path): cudaStreamIsCapturing per replay cost
                                 # more than the 2 us budget allowed on an H200 (run 2, 2026-12-01)
                                 capturing=0, nslots=writer._MASK + 1,
                                 prefill=min(2 * PREFILL_PAIRS, 2 * (writer._MASK + 1)), poll_s=gpu._gpu_poll_s(),
                                 thread_init=paths.thread_init, start_events=start_events)
    except Exception as exc:
        warn_once("graph-native", f"graph replays timed by the Python timer ({type(exc).__name__}: {exc})")
        return None


def make_graph_wrapper(fn: Callable[..., Any], spec: TargetSpec, *, python: bool = False) -> Callable[..., Any]:
    """Wrap a graph-replay entry ``fn(self, shape_key, ...)`` so each replay is one ring slot with its events.

    The shape key is ``spec.size_arg`` (a parameter name or position, default position 1: the argument after
    ``self``, as in SGLang's ``replay(self, shape_key, static_forward_batch, **kwargs)``). A replay whose shape
    cannot be read (a key without an integer size) is still timed, with gather size -1 and no key.

    Where the C writer is loaded (and not ``python``: the bench's Python arm), the wrapper is its ``GraphWrapper``
    (the same slot, the same timer calls; see the module doc); else the Python wrapper below. Both read the
    runner's width once per owner (the backend object last seen): SGLang sets ``captured_req_width`` and
    ``ragged_verify_mode`` when the runner is made, and the getattr chain cost ~0.5 us a replay.
    """
    tidx = writer._register_target(spec.name)
    key_pos = spec.size_arg if isinstance(spec.size_arg, int) else 1
    key_name = spec.size_arg if isinstance(spec.size_arg, str) else "shape_key"
    nat = None if python else writer._native()
    if nat is not None:
        native: Callable[..., Any] = functools.update_wrapper(
            nat.GraphWrapper(fn, tidx, key_pos, key_name, globals(), writer._ensure_ring, _decide), fn)
        native.__sgl_seat_probe__ = spec.name  # type: ignore[attr-defined]
        return native
    now_ns = time.time_ns
    ident = threading.get_ident
    pack = _SLOT.pack_into
    base = HEADER_BYTES // SLOT_BYTES
    flag, key_max, key_shift = GRAPH_FLAG, GRAPH_KEY_MAX, GRAPH_KEY_SHIFT
    cache: list[Any] = [object(), 1]  # the last owner and its runner's width (replay_shape of a key of size 1)

    @functools.wraps(fn)
    def graph_replay_wrapper(*args: Any, **kwargs: Any) -> Any:
        q = writer._Q
        if q is None:
            if not writer._ensure_ring():
                return fn(*args, **kwargs)
            q = writer._Q
            if q is None:
                return fn(*args, **kwargs)
        timer = _TIMER if _DECIDED else _decide()
        try:
            key = args[key_pos] if len(args) > key_pos else kwargs[key_name]
            size = key if type(key) is int else key.size
            if type(size) is not int:
                raise TypeError(size)
            owner = args[0] if args else None
            if owner is not cache[0]:
                cache[:] = [owner, replay_shape(owner, 1)[0]]
            gs = size * cache[1]
            tword = tidx | flag | (min(max(size, 0), key_max) << key_shift)
        except Exception:
            gs, tword = -1, tidx
        c = writer._NEXT()
        b = ((c & writer._MASK) + base) << 3
        lap = (c >> writer._SHIFT & _LAP_MASK) << _END_BITS
        started = timer.before() if timer is not None else None
        try:  # (the ignore: writer._MM is set whenever writer._Q is, which was checked above)
            pack(writer._MM, b << 3, 2 * c + 1, c, now_ns(), 0, gs, ident(), tword,  # type: ignore[arg-type]
                 GPU_NONE if started is None else GPU_QUEUED)
            q[b] = 2 * c + 2
        except Exception:  # a ring gone: the replay runs untimed (its start event completes unread)
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            if started is not None and timer is not None and not timer.after(started, b, c):
                q[b + _W_GPU] = GPU_NONE
            q[b + _W_END] = lap | (now_ns() & _END_MASK)

    graph_replay_wrapper.__sgl_seat_probe__ = spec.name  # type: ignore[attr-defined]
    return graph_replay_wrapper


def _after_fork_in_child() -> None:
    global _TIMER, _DECIDED, _LOCK
    _TIMER, _DECIDED, _LOCK = None, False, threading.Lock()  # the parent's reader thread does not exist here
    if writer._NATIVE is not None:
        writer._NATIVE.graph_clear(None)  # nor its C timer's queue and locks


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
