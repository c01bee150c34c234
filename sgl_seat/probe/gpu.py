"""The GPU stream timer: one CUDA event after wrapped calls, resolved by a reader thread in the engine process.

GPU stream (``SGLSEAT_PROBE_GPU``: ``auto`` (default: on when the process has initialised CUDA by its
first wrapped call), ``1``, ``0``): on a GPU a wrapped call mostly *enqueues* work, and a stalled host read
(SGLang's Engram table read over UVA) stalls a kernel, not the call. So each call also records one CUDA
event on the current stream after it (pooled, no synchronisation on the hot path; skipped while a CUDA graph
is captured; calls within ``SGLSEAT_PROBE_GPU_COALESCE_US`` (1000) of their stream's last event share the
next one; ``SGLSEAT_PROBE_GPU_PATH`` picks how events are recorded, see :func:`cuda_paths`). A reader
thread in the engine process (``sgl-seat-probe-gpu``) resolves them every
``SGLSEAT_PROBE_GPU_POLL_S`` (0.02 s; less often while nothing is queued) and publishes into the same ring:
the slot's last word says none / queued / started / done, and a side area after the slots holds the GPU
start and end (wall clock). The end is when the reader saw the event complete; the start is a bound, not an
event: the later of the host call's start and the previous probed end on the same stream (see
:class:`GpuTimer`). The oldest unfinished call of a stream is "in flight on the GPU", with its age; later
ones are queued behind it. Calls replayed inside a CUDA graph run no Python and are not seen.

torch is imported only here and only when GPU timing starts (it is never imported at the probe's import). The
timer in use is the writer's ``_GPU`` (:mod:`.writer` holds the state the hot path reads); this module sets it.

Why a module of its own: the GPU timer (events, streams, graph-capture hooks, the reader thread) is most of
the probe's code and none of the ring writer's hot path when no GPU is in use. The replay timers
(:mod:`.graph`) build on its reader loop (:class:`ReaderLoop`) and event pool (:class:`EventTimer`).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import writer
from .guard import reader_thread, warn_once
from .ring import (
    _GPU_OFF,
    _GPU_OFF_AT,
    _W_CALL,
    _W_GPU,
    _W_START,
    GPU_DONE,
    GPU_NONE,
    GPU_QUEUED,
    GPU_STARTED,
    HEADER_BYTES,
    SLOT_BYTES,
)

ENV_GPU = "SGLSEAT_PROBE_GPU"
ENV_GPU_POLL = "SGLSEAT_PROBE_GPU_POLL_S"
ENV_GPU_PATH = "SGLSEAT_PROBE_GPU_PATH"  # base | ctypes | method (see cuda_paths)
DEFAULT_GPU_PATH = "base"
ENV_GPU_COALESCE = "SGLSEAT_PROBE_GPU_COALESCE_US"  # see GpuTimer; 0: an event after every call
DEFAULT_COALESCE_US = 1000.0
ENV_GPU_TIMING = "SGLSEAT_PROBE_GPU_TIMING"  # 1 (default): timing events, completion times to microseconds
PREFILL_EVENTS = 1024  # events made when GPU timing starts (GpuTimer.prefill): ~10 ms once, none on the hot path


#: (captures, key_fn, key_arg, record_addr, exact_arg): see GpuTimer._fast.
FastPath = tuple[list[int], Callable[[Any], Any], Any, int, Any]


class ReaderLoop:
    """A timer's reader thread: :meth:`poll` every ``poll_s`` while work is queued, every ``idle_poll_s`` while not.

    One loop for the three timers that resolve CUDA events off the hot path (:class:`GpuTimer` here, and graph.py's
    ``ReplayTimer`` and ``NativeReplayTimer``): they differ in what they queue and how a poll resolves it, not in
    how their reader runs, and a fix to one copy of the loop would not reach the others. A subclass gives
    :meth:`poll` (publish what completed; how many stay unresolved), :meth:`_busy` (work queued before a poll),
    :meth:`_unresolved` (after it) and :attr:`thread_name`; :meth:`stop` ends the loop (a subclass that holds
    more, the C writer's share, gives it back after calling this one).
    """

    #: The reader thread's name (what a thread listing or a stack dump of the engine shows); each timer sets its own.
    thread_name: str

    def __init__(self, poll_s: float, clock: Callable[[], float], thread_init: Callable[[], None] | None) -> None:
        self.poll_s = poll_s
        #: How long the reader sleeps while nothing is queued (a call seen late is still timed from its own start).
        self.idle_poll_s = max(poll_s, 0.2)
        self._clock = clock
        self._thread_init = thread_init
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def poll(self, now: float | None = None) -> int:
        """Publish what completed since the last poll; returns how much is still unresolved."""
        raise NotImplementedError

    def _busy(self) -> bool:
        """Whether work is queued now, before a poll."""
        raise NotImplementedError

    def _unresolved(self, polled: int) -> int:
        """What is still queued after a poll that returned ``polled`` (0 where it raised)."""
        return polled

    def start(self) -> None:
        """Start the reader thread (once)."""
        if self._thread is None:
            self._thread = reader_thread(self._run, self.thread_name, self._stop)

    def _run(self) -> None:
        if self._thread_init is not None:
            with contextlib.suppress(Exception):
                self._thread_init()  # relaxed capture mode: a query here must not invalidate a capture elsewhere
        wait = self.poll_s
        while not self._stop.wait(wait):
            # Work queued since the last poll (it left none unresolved, or it left some): keep the short period.
            # Testing the queue *after* the poll instead would back off whenever a poll resolves everything, as it
            # does on a fast stream, and the event pool would drain between polls (measured: +7-10 us a call).
            busy = self._busy()
            polled = 0
            with contextlib.suppress(Exception):  # never raise into the engine
                polled = self.poll()
            wait = self.poll_s if busy or self._unresolved(polled) else self.idle_poll_s

    def stop(self) -> None:
        self._stop.set()


class EventTimer(ReaderLoop):
    """The Python timers' share (:class:`GpuTimer`, graph.py's ``ReplayTimer``): events from ``event_factory``,
    pooled; ``record(event, key)`` (``event.record()`` by default), ``query(event)`` (``event.query()`` by default)
    and ``event_time(event)`` (optional: the wall time it completed); the ring's GPU side area at ``gpu_off`` for
    ``nslots`` slots, also the bound on unresolved work. ``_queued`` is the subclass's count of unresolved work,
    which its poll recounts.
    """

    def __init__(self, event_factory: Callable[[], Any], *, gpu_off: int, nslots: int, poll_s: float,
                 clock: Callable[[], float], record: Callable[[Any, Any], Any] | None,
                 query: Callable[[Any], bool] | None, thread_init: Callable[[], None] | None,
                 event_time: Callable[[Any], float | None] | None) -> None:
        super().__init__(poll_s, clock, thread_init)
        self._factory = event_factory
        self._record: Callable[[Any, Any], Any] = record if record is not None else _record_method
        self._query: Callable[[Any], bool] = query if query is not None else _query_method
        self._event_time = event_time
        self._gpu_word = gpu_off // 8  # first double of the side area, in 8-byte words
        self._base = HEADER_BYTES // SLOT_BYTES
        self._limit = nslots
        self._free: list[Any] = []
        self._queued = 0
        self.errors = 0

    def _busy(self) -> bool:
        return self._queued > 0

    def _unresolved(self, polled: int) -> int:
        return self._queued  # the poll's recount, or the count as it was where the poll raised

    def prefill(self, n: int) -> None:
        """Make ``n`` events now, off the hot path. Why: an empty pool makes the hot path create its event
        (``torch.cuda.Event()`` and a first record: 6-12 us on the H200 hosts measured), and the pool only refills
        as the reader resolves calls; a fast caller (tens of thousands of calls a second) between two polls drains
        a cold pool. Measured on the eager path around the sim's CUDA fetch with a cold pool: +4-10 us per call
        instead of ~2 us."""
        for _ in range(max(0, n)):
            self._free.append(self._factory())


def _no_stream() -> Any:
    return None


def _record_method(ev: Any, key: Any) -> Any:
    return ev.record()


def _query_method(ev: Any) -> bool:
    return bool(ev.query())


class _Stream:
    """One stream's unresolved calls: groups closed by an event, and the calls since its last event."""

    __slots__ = ("groups", "last_rec_ns", "open", "seen")

    def __init__(self) -> None:
        # (event, calls) in record order; the event was recorded after the last of its calls (slot word, call number).
        self.groups: collections.deque[tuple[Any, list[tuple[int, int]]]] = collections.deque()
        self.open: list[tuple[int, int]] = []  # calls after the last event, waiting for the next one
        self.last_rec_ns = 0  # perf_counter_ns of the last event recorded on this stream
        self.seen: float | None = None  # when the reader saw this stream's last probed work complete


class GpuTimer(EventTimer):
    """Records one CUDA event after wrapped calls, on the current stream, and resolves them off the hot path.

    Why one event, not a pair around the call: recording an event from Python costs 0.8-2 us on the H200 hosts
    measured (more right after a host-to-device copy; ``bench/gpu/event_cost.py``, ``record_after_copy.py``), and
    the probe's budget for GPU timing is 2 us per call. The call's *end* event says when its work finished on the
    stream; its *start* is bounded by the previous probed work on the same stream (the stream runs in order: once
    that completed, this call's work could start) and by the host call's own start (the work did not exist
    before it was enqueued). So the reader publishes, for the oldest unfinished call of each stream,
    ``gpu_start = max(host start, when the reader saw the previous probed work complete)`` and state *started*;
    later calls on the stream stay *queued* (their work waits behind it). What a second event would have told
    apart, and this does not: unprobed work between two probed calls (a matmul, an all-reduce) counts into the
    next call's in-flight age. A rank whose host runs ahead while its stream waits in a collective thus shows its
    next probed call "in flight" too; the stalled rank's call is older by the GPU work between two probed calls
    (the rest of a step), and the detectors name the oldest; where that work is shorter than the readers' poll
    jitter (``poll_s`` each) either rank can come out oldest.

    Coalescing (``coalesce_us``, ``SGLSEAT_PROBE_GPU_COALESCE_US``, default 1000; 0: an event every call): a call
    that comes less than that after the last event recorded on its stream, while that stream still has
    unresolved calls, records none; it completes with the next event recorded on the stream (stream order), or,
    when no later call records one, when the stream is seen idle (``stream_idle``). Such calls cost the stream
    lookup and a list append, not the runtime call. A stall inside one is still seen: the last event before it
    completed, the next one (or the stream's idleness) never comes, so its group's first call is in flight.

    ``event_factory`` makes one event (a ``torch.cuda.Event``, or a fake in tests). ``stream_key()`` names the
    current stream (the raw handle in CUDA); ``record(event, key)`` records the event on it (``event.record()`` by
    default); ``query(event)`` says whether it completed (``event.query()`` by default); ``stream_idle(key)``
    whether all work on the stream completed (None: not known); ``capturing()`` whether a CUDA graph is being
    captured (an event recorded then would belong to the graph). The hot path (:meth:`end`) takes a pooled event,
    records it and queues it: no synchronisation, no query, no allocation once the pool is warm. :meth:`poll`
    (the reader thread, or a test directly) resolves each stream's queue; the reader thread is
    :class:`ReaderLoop`'s.
    """

    thread_name = "sgl-seat-probe-gpu"

    def __init__(self, event_factory: Callable[[], Any], capturing: Callable[[], bool], *, gpu_off: int,
                 nslots: int, poll_s: float = 0.02, clock: Callable[[], float] = time.time,
                 stream_key: Callable[[], Any] | None = None, record: Callable[[Any, Any], Any] | None = None,
                 query: Callable[[Any], bool] | None = None, stream_idle: Callable[[Any], bool | None] | None = None,
                 thread_init: Callable[[], None] | None = None, coalesce_us: float = 0.0,
                 event_time: Callable[[Any], float | None] | None = None) -> None:
        super().__init__(event_factory, gpu_off=gpu_off, nslots=nslots, poll_s=poll_s, clock=clock, record=record,
                         query=query, thread_init=thread_init, event_time=event_time)
        self._stream_key: Callable[[], Any] = stream_key if stream_key is not None else _no_stream
        self._stream_idle = stream_idle
        self._capturing = capturing
        self._coalesce_ns = int(max(0.0, coalesce_us) * 1000)
        self._streams: dict[Any, _Stream] = {}
        # _queued (EventTimer's) counts the calls queued and not yet resolved, all streams: the hot path's bound.
        self.queries = 0  # event and stream queries the reader made (the bench reports it)
        self.recorded = 0  # events recorded (calls - recorded: calls that rode on a later event)
        self._nat: Any = None  # the C writer, while it takes this timer's hot path (see _fast)
        self._fast_cfg: FastPath | None = None

    # -- the C writer's share ------------------------------------------------------------------------
    @property
    def _fast(self) -> FastPath | None:
        """For the C writer (``probe_native.c``, ``gpu_setup``): ``(captures, key_fn, key_arg, record_addr,
        exact_arg)`` lets it do :meth:`end`'s work itself on the streams this timer knows, keeping the calls that
        ride on a later event in a buffer of its own until :meth:`_drain` moves them here: the stream key is
        ``key_fn(key_arg)`` (``key_arg()`` first where it is callable), ``captures[0]`` the count of graph captures
        in progress (the capture hooks' list), ``record_addr`` the address of the CUDA runtime's
        ``cudaEventRecord`` (0: recording stays here), and ``exact_arg`` (None: none) the argument whose key a
        call that records must match (else it comes here). None: every call goes through :meth:`end`. Set only
        where it means what ``stream_key``, ``capturing`` and ``record`` mean (:func:`_fast_path`); setting it
        registers the timer with the C writer where this process has one."""
        return self._fast_cfg

    @_fast.setter
    def _fast(self, cfg: FastPath | None) -> None:
        if self._nat is not None:
            self._drain()
            self._nat.gpu_clear(self)
            self._nat = None
        self._fast_cfg = cfg
        nat = writer._NATIVE
        if cfg is not None and nat is not None:
            captures, key_fn, key_arg, record_addr, exact_arg = cfg
            nat.gpu_setup(self, captures, key_fn, key_arg, int(record_addr), exact_arg, self._coalesce_ns,
                          self._limit)
            nat.gpu_set_queued(self._queued)
            self._nat = nat

    def _drain(self) -> None:
        """Bring the calls the C writer queued in its own buffer into their streams' lists (before this timer
        reads or changes that state; under the GIL, so none is in flight meanwhile)."""
        nat = self._nat
        if nat is not None:
            self._queued += nat.gpu_drain(self, self._streams)

    # -- hot path ------------------------------------------------------------------------------------
    def end(self, b: int, c: int) -> None:
        """After the call in slot word ``b`` (call ``c``): queue it on its stream, recording an event unless a
        recent one on that stream will cover it; or mark the slot untimed.

        The wrapper wrote the slot with state *queued*; where the call is not queued (a CUDA graph being
        captured, too many unresolved calls, an error) the state goes back to *none*.
        """
        q = writer._Q
        try:
            if self._nat is not None:
                self._drain()
            if self._queued < self._limit and not self._capturing():
                key = self._stream_key()
                s = self._streams.get(key)
                if s is None:
                    s = self._streams[key] = _Stream()
                now = _perf_ns()
                if s.groups and now - s.last_rec_ns < self._coalesce_ns:
                    s.open.append((b, c))
                else:
                    ev = self._free.pop() if self._free else self._factory()
                    self._record(ev, key)
                    # One statement, no call inside: the reader thread never sees these calls both waiting and
                    # in the new group (CPython switches threads only at calls and backward jumps).
                    calls, s.open = s.open, []
                    calls.append((b, c))
                    s.groups.append((ev, calls))
                    s.last_rec_ns = now
                    self.recorded += 1
                    if self._nat is not None:
                        self._nat.gpu_arm(key, now)
                self._queued += 1
                return
        except Exception as exc:
            self.errors += 1
            warn_once("gpu-record", f"cannot record a CUDA event ({type(exc).__name__}: {exc})")
        if q is not None:
            q[b + _W_GPU] = GPU_NONE

    # -- reader ----------------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> int:
        """Publish what completed since the last poll; returns how many calls are still unresolved.

        Per stream: events complete in record order, so the completed groups are a prefix of the queue, found
        with at most ~log2(n) + 2 queries (the newest first: when it completed, all did). Completed calls get
        state *done* (``gpu_end`` = now: the poll's resolution); the oldest unfinished one *started*.
        """
        q, d = writer._Q, writer._D
        t = self._clock() if now is None else now
        nat = self._nat
        if nat is not None:
            self._drain()
        left = 0
        for key, s in list(self._streams.items()):
            if not s.groups and not s.open:
                continue
            try:
                k = self._done_prefix(s.groups) if s.groups else 0
                tail_done = (k == len(s.groups) and bool(s.open) and self._stream_idle is not None
                             and bool(self._stream_idle(key)))
                if tail_done:
                    self.queries += 1
            except Exception as exc:  # a query that fails (an event captured into a graph after all): drop them
                self.errors += 1
                warn_once("gpu-query", f"cannot query a CUDA event ({type(exc).__name__}: {exc}); those calls untimed")
                self._drop(key, s, q)
                continue
            seen = t
            if k and self._event_time is not None:
                # When the last completed event completed, on the wall clock (timing events): the next call's
                # start bound, to microseconds instead of the poll's period. Read before the event is pooled.
                with contextlib.suppress(Exception):
                    at = self._event_time(s.groups[k - 1][0])
                    if at is not None:
                        seen = min(t, at if s.seen is None else max(at, s.seen))
            prev = s.seen
            done: list[tuple[int, int]] = []
            for _ in range(k):
                ev, calls = s.groups.popleft()
                self._free.append(ev)
                done.extend(calls)
            if k and not s.groups and nat is not None:
                nat.gpu_disarm(key)  # the next call on this stream records its own event
            if tail_done:
                tail, s.open = s.open, []  # one statement: see end()
                done.extend(tail)
            if done:
                self._queued -= len(done)
                s.seen = seen
                if q is not None and d is not None:
                    for b, c in done:
                        if q[b + _W_CALL] != c:
                            continue  # the slot was reused: nothing to publish
                        g = self._gpu_word + 2 * ((b >> 3) - self._base)
                        if q[b + _W_GPU] != GPU_STARTED:
                            d[g] = self._start_bound(q, b, prev)
                        d[g + 1] = t
                        q[b + _W_GPU] = GPU_DONE
                        prev = seen
                prev = seen  # the head's predecessor completed with the last of these
            head = s.groups[0][1][0] if s.groups else (s.open[0] if s.open else None)
            if head is not None and q is not None and d is not None:
                b, c = head
                if q[b + _W_CALL] == c and q[b + _W_GPU] == GPU_QUEUED:
                    d[self._gpu_word + 2 * ((b >> 3) - self._base)] = self._start_bound(q, b, prev)
                    q[b + _W_GPU] = GPU_STARTED
            left += sum(len(calls) for _ev, calls in s.groups) + len(s.open)
        # Recounted, not only decremented: a call appended to a waiting list just as the reader took it is never
        # published (its slot stays queued: never "in flight"), and its count must not hold the bound forever.
        self._queued = left
        if nat is not None:
            nat.gpu_set_queued(left)
        return left

    def _done_prefix(self, groups: collections.deque[tuple[Any, list[tuple[int, int]]]]) -> int:
        """How many groups at the front of one stream's queue have completed."""
        query = self._query
        n = len(groups)
        self.queries += 1
        if query(groups[-1][0]):
            return n
        if n == 1:
            return 0
        self.queries += 1
        if not query(groups[0][0]):
            return 0
        lo, hi = 0, n - 1  # groups[lo] completed, groups[hi] did not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            self.queries += 1
            if query(groups[mid][0]):
                lo = mid
            else:
                hi = mid
        return lo + 1

    @staticmethod
    def _start_bound(q: memoryview[int], b: int, prev: float | None) -> float:
        """When the call's GPU work could have started: not before its host call, nor before the previous probed
        work on its stream was seen complete."""
        host = q[b + _W_START] / 1e9
        return host if prev is None or prev < host else prev

    def _drop(self, key: Any, s: _Stream, q: memoryview[int] | None) -> None:
        if self._nat is not None:
            self._nat.gpu_disarm(key)
        calls = [bc for _ev, group in s.groups for bc in group] + s.open
        self._free.extend(ev for ev, _group in s.groups)
        s.groups.clear()
        s.open = []
        self._queued -= len(calls)
        if q is not None:
            for b, c in calls:
                if q[b + _W_CALL] == c:
                    q[b + _W_GPU] = GPU_NONE

    def _busy(self) -> bool:
        nat = self._nat
        return self._queued > 0 or (nat is not None and nat.gpu_pending() > 0)

    def stop(self) -> None:
        super().stop()
        if self._nat is not None:
            self._drain()
            self._nat.gpu_clear(self)  # the wrapper goes back to end(), which a stopped timer still serves
            self._nat = None


_perf_ns = time.perf_counter_ns


# While a CUDA graph is captured through torch's CUDAGraph (torch.cuda.graph, make_graphed_callables, SGLang's
# graph runners), wrapped calls record no event: see _graph_capture_hooks. One-element list: the count of captures
# in progress, shared with every copy of this module in the process (the boot loads it by path; an engine may
# import it too) through the wrapped method's attribute.
_CAPTURES: list[int] = [0]


def _graph_capturing() -> bool:
    return _CAPTURES[0] > 0


def _graph_capture_hooks(torch: Any) -> Callable[[], bool] | None:
    """A capture test that costs a list read, not a runtime call per wrapped call (``torch.cuda.
    is_current_stream_capturing()`` measured 0.28-0.30 us on an H200 host: a seventh of the budget).

    Wraps ``torch.cuda.CUDAGraph.capture_begin``/``capture_end`` to count captures in progress, any thread (an
    event recorded on a stream that another thread captures is no concern of the capture, but a count is
    simpler and errs towards skipping). None where the class has no such methods (the caller then asks torch per
    call). A capture begun before the hooks went in is seen by one direct test here.
    """
    global _CAPTURES
    graph_cls = getattr(getattr(torch.cuda, "graphs", None), "CUDAGraph", None)
    begin = getattr(graph_cls, "capture_begin", None)
    finish = getattr(graph_cls, "capture_end", None)
    if graph_cls is None or begin is None or finish is None:
        return None
    shared = getattr(begin, "__sgl_seat_captures__", None)
    if isinstance(shared, list):
        _CAPTURES = shared
    else:
        count: list[int] = [0]

        @functools.wraps(begin)
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            try:
                return begin(self, *args, **kwargs)
            except BaseException:
                count[0] = max(0, count[0] - 1)
                raise

        @functools.wraps(finish)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return finish(self, *args, **kwargs)
            finally:
                count[0] = max(0, count[0] - 1)

        capture_begin.__sgl_seat_captures__ = count  # type: ignore[attr-defined]
        graph_cls.capture_begin = capture_begin
        graph_cls.capture_end = capture_end
        _CAPTURES = count
    with contextlib.suppress(Exception):
        if torch.cuda.is_current_stream_capturing():
            _CAPTURES[0] = max(_CAPTURES[0], 1)
    return _graph_capturing


@dataclass(frozen=True)
class CudaPaths:
    """How the timer names streams, makes, records and queries events in a CUDA process (see :func:`cuda_paths`)."""

    factory: Callable[[], Any]
    stream_key: Callable[[], Any]
    record: Callable[[Any, Any], Any]
    query: Callable[[Any], bool]
    stream_idle: Callable[[Any], bool | None] | None
    thread_init: Callable[[], None] | None
    how: str
    event_time: Callable[[Any], float | None] | None = None
    #: For the C writer: the stream key as ``fast_key[0](fast_key[1])`` (a builtin and its argument, or a callable
    #: giving it) with ``fast_key[2]`` the argument that gives the exact key (the thread's current device), and the
    #: address of ``cudaEventRecord`` where the pool's events can be recorded through it (0: not).
    fast_key: tuple[Callable[[Any], Any], Any, Any] | None = None
    record_addr: int = 0


def cuda_paths(torch: Any, how: str = "base", timing: bool = True) -> CudaPaths:
    """Event paths that skip ``torch.cuda.Event.record()``'s per-call ``Stream`` object (5.8-11 us per call).

    The stream key is the current raw stream handle (``torch._C._cuda_getCurrentRawStream``). ``how``: ``base``
    records through ``torch._C._CudaEventBase.record(event, stream)`` with the stream's ``Stream`` object cached by
    its handle; ``ctypes`` calls the runtime's ``cudaEventRecord`` on the raw handle; ``method`` is
    ``Event.record()`` (the slow reference). Measured on H200 hosts, ns per record of a plain event with the
    stream lookup: ctypes 976-1051, base 1150-1169, method 5938-6319 (``bench/gpu/event_cost.py``). Events are
    made without timing (``cudaEventDisableTiming``: half the cost of a timing event's record, 0.8 against 1.8 us;
    nothing here needs elapsed times). ``stream_idle`` is the runtime's ``cudaStreamQuery``. ``thread_init`` puts
    the reader thread in relaxed stream-capture mode: a query from another thread while one captures a graph in
    torch's default (global) mode invalidates that capture (``bench/gpu/capture_check.py``). Raises where a path is
    not available.

    ``timing`` (``SGLSEAT_PROBE_GPU_TIMING``, default on): timing events, and ``event_time`` giving the wall-clock
    moment an event completed (a reference event recorded on a private idle stream and synchronised, its wall time
    the midpoint of that wait; then ``elapsed_time``; re-anchored every 30 s). Why: the next call's start bound is
    when the previous event completed; seen by the reader's poll it is late by up to the poll period (20 ms), and
    with the host a step ahead that jitter decided which rank looked stalled longer (``bench/gpu/runahead_check.py``:
    the wrong rank named once in two at 1 ms steps). A timing event costs ~1 us more to record (1.8 against 0.8 us).
    """
    import ctypes

    raw_stream = torch._C._cuda_getCurrentRawStream
    get_device = torch._C._cuda_getDevice
    lib = cudart(ctypes)

    # The current device's stream: -1 asks torch for the current device itself (one binding call instead of two);
    # where a torch does not give the same handle that way, the device is asked first.
    current_by_minus_one = False
    with contextlib.suppress(Exception):
        current_by_minus_one = raw_stream(-1) == raw_stream(get_device())
    key_arg: Any = -1 if current_by_minus_one else get_device

    if current_by_minus_one:
        def stream_key() -> Any:
            return raw_stream(-1)
    else:
        def stream_key() -> Any:
            return raw_stream(get_device())

    def factory() -> Any:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record()  # creates the CUDA event (torch creates it lazily, on the first record)
        return ev

    def query(ev: Any) -> bool:
        return bool(ev.query())

    record: Callable[[Any, Any], Any]
    paths_factory: Callable[[], Any]
    query_fn: Callable[[Any], bool]
    if how == "ctypes":
        if lib is None:
            raise OSError("no libcudart found")
        rec = lib.cudaEventRecord
        rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        rec.restype = ctypes.c_int

        def factory_ct() -> Any:
            ev = factory()
            return (ev, ev.cuda_event)

        def record_ct(item: Any, key: Any) -> None:
            err = rec(item[1], key)
            if err:
                raise RuntimeError(f"cudaEventRecord returned {err}")

        def query_ct(item: Any) -> bool:
            return bool(item[0].query())

        paths_factory, record, query_fn = factory_ct, record_ct, query_ct
    elif how == "base":
        base_record = torch._C._CudaEventBase.record
        current_stream = torch.cuda.current_stream
        cache: dict[int, Any] = {}

        def record_base(ev: Any, key: Any) -> None:
            obj = cache.get(key)
            if obj is None:
                if len(cache) > 64:
                    cache.clear()
                obj = cache[key] = current_stream()
            base_record(ev, obj)

        paths_factory, record, query_fn = factory, record_base, query
    elif how == "method":
        def record_method(ev: Any, key: Any) -> None:
            ev.record()

        paths_factory, record, query_fn = factory, record_method, query
    else:
        raise ValueError(f"unknown event path {how!r}")
    thread_init = None
    stream_idle = None
    if lib is not None and hasattr(lib, "cudaThreadExchangeStreamCaptureMode"):
        exchange = lib.cudaThreadExchangeStreamCaptureMode

        def thread_init() -> None:
            mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
            exchange(ctypes.byref(mode))

    if lib is not None and hasattr(lib, "cudaStreamQuery"):
        squery = lib.cudaStreamQuery
        squery.argtypes = [ctypes.c_void_p]
        squery.restype = ctypes.c_int

        def stream_idle(key: Any) -> bool | None:
            rc = squery(key)
            return True if rc == 0 else False if rc == 600 else None  # 600: cudaErrorNotReady

    event_time = _wall_clock_of_events(torch, how) if timing else None
    # One round trip, so a path that does not work with torch's context fails here, not on the hot path.
    probe_ev = paths_factory()
    record(probe_ev, stream_key())
    torch.cuda.synchronize()
    if not query_fn(probe_ev):
        raise RuntimeError("a recorded event did not complete after a synchronize")
    if event_time is not None and event_time(probe_ev) is None:
        event_time = None
    record_addr = _native_record_addr(ctypes, lib, paths_factory, stream_key, query_fn, torch) if how == "base" else 0
    # The C writer's coalesced calls key the stream by the device current now (the process's: an SGLang scheduler
    # or a sim rank runs on one), not by asking the runtime each call (~270 ns after a 32-row gather on an H200
    # host, bench/gpu/writer_cost.py --lookups); a call that records checks the exact key first.
    fixed = get_device() if current_by_minus_one else get_device
    return CudaPaths(paths_factory, stream_key, record, query_fn, stream_idle, thread_init, how, event_time,
                     (raw_stream, fixed, key_arg), record_addr)


def cudart(ctypes: Any) -> Any:
    """The CUDA runtime library torch loaded (the first of the sonames that loads; the process's copy where torch
    loaded it already), or None."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _native_record_addr(ctypes: Any, lib: Any, factory: Callable[[], Any], stream_key: Callable[[], Any],
                        query: Callable[[Any], bool], torch: Any) -> int:
    """The address of the runtime's ``cudaEventRecord`` for the C writer, once one of the pool's events recorded
    through it completed after a synchronize (the same runtime as torch's); 0 where that cannot be had."""
    if lib is None or not hasattr(lib, "cudaEventRecord"):
        return 0
    try:
        addr = int(ctypes.cast(lib.cudaEventRecord, ctypes.c_void_p).value or 0)
        ev = factory()
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(addr)
        if proto(ev.cuda_event, stream_key()) != 0:
            return 0
        torch.cuda.synchronize()
        return addr if query(ev) else 0
    except Exception:
        return 0


def _fast_path(timer: GpuTimer, paths: CudaPaths, capturing: Callable[[], bool]) -> None:
    """Let the C writer do ``end``'s work itself where the capture test is the hooks' count (a list it can read) and
    the stream key the paths' builtin; it records through ``cudaEventRecord`` where the paths found it working.
    Elsewhere every call goes through ``end``."""
    if capturing is _graph_capturing and paths.fast_key is not None:
        timer._fast = (_CAPTURES, paths.fast_key[0], paths.fast_key[1], paths.record_addr, paths.fast_key[2])


def _wall_clock_of_events(torch: Any, how: str) -> Callable[[Any], float | None]:
    """``event -> wall time it completed`` for timing events of this process's current device (see cuda_paths)."""
    stream = torch.cuda.Stream()  # private: nothing else runs on it, so its event completes at once
    anchor: list[Any] = [None, 0.0, 0.0]  # reference event, its wall time, when it was taken (monotonic)

    def reanchor() -> None:
        ev = torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        ev.record(stream)
        ev.synchronize()
        t1 = time.time()
        anchor[:] = [ev, (t0 + t1) / 2, time.monotonic()]

    reanchor()

    def event_time(item: Any) -> float | None:
        ev = item[0] if how == "ctypes" else item
        if time.monotonic() - anchor[2] > 30.0:
            reanchor()
        return float(anchor[1] + anchor[0].elapsed_time(ev) / 1e3)

    return event_time


def enable_gpu(event_factory: Callable[[], Any], capturing: Callable[[], bool] = lambda: False, *,
               poll_s: float | None = None, start_thread: bool = True, stream_key: Callable[[], Any] | None = None,
               record: Callable[[Any, Any], Any] | None = None, query: Callable[[Any], bool] | None = None,
               stream_idle: Callable[[Any], bool | None] | None = None,
               thread_init: Callable[[], None] | None = None, coalesce_us: float | None = None,
               event_time: Callable[[Any], float | None] | None = None) -> GpuTimer | None:
    """Time wrapped calls on the GPU stream too (the ring must exist; created if need be). Tests pass fakes.

    ``start_thread=False`` leaves resolving to explicit :meth:`GpuTimer.poll` calls (deterministic tests);
    ``coalesce_us`` None: ``SGLSEAT_PROBE_GPU_COALESCE_US`` (default 1000).
    """
    if not writer._ensure_ring() or writer._MM is None:
        return None
    gpu_off = _GPU_OFF.unpack_from(writer._MM, _GPU_OFF_AT)[0]
    nslots = writer._MASK + 1
    if writer._GPU is not None:
        writer._GPU.stop()
    timer = GpuTimer(event_factory, capturing, gpu_off=gpu_off, nslots=nslots,
                     poll_s=poll_s if poll_s is not None else _gpu_poll_s(), stream_key=stream_key, record=record,
                     query=query, stream_idle=stream_idle, thread_init=thread_init,
                     coalesce_us=_gpu_coalesce_us() if coalesce_us is None else coalesce_us, event_time=event_time)
    if start_thread:
        timer.start()
    writer._GPU = timer
    return timer


def enable_gpu_cuda(torch: Any, how: str = DEFAULT_GPU_PATH, *, start_thread: bool = True,
                    coalesce_us: float | None = None, timing: bool | None = None) -> GpuTimer | None:
    """:func:`enable_gpu` with the real CUDA paths (:func:`cuda_paths`) and the graph-capture hooks."""
    paths = cuda_paths(torch, how, _gpu_timing() if timing is None else timing)
    capturing = _graph_capture_hooks(torch) or torch.cuda.is_current_stream_capturing
    timer = enable_gpu(paths.factory, capturing, start_thread=False, stream_key=paths.stream_key,
                       record=paths.record, query=paths.query, stream_idle=paths.stream_idle,
                       thread_init=paths.thread_init, coalesce_us=coalesce_us, event_time=paths.event_time)
    if timer is not None:
        _fast_path(timer, paths, capturing)
        timer.prefill(PREFILL_EVENTS)
        if start_thread:
            timer.start()
    return timer


def disable_gpu() -> None:
    if writer._GPU is not None:
        writer._GPU.stop()
    writer._GPU = None


def gpu_timer() -> GpuTimer | None:
    t = writer._GPU  # only this module sets it, to a GpuTimer (the writer knows it as a protocol)
    return t if isinstance(t, GpuTimer) else None


def _gpu_poll_s() -> float:
    try:
        val = float(os.environ.get(ENV_GPU_POLL, "0.02"))
    except ValueError:
        return 0.02
    return val if 0.001 <= val <= 5.0 else 0.02


def _gpu_timing() -> bool:
    return os.environ.get(ENV_GPU_TIMING, "1").strip().lower() not in ("0", "off", "false", "no")


def _gpu_coalesce_us() -> float:
    try:
        val = float(os.environ.get(ENV_GPU_COALESCE, DEFAULT_COALESCE_US))
    except ValueError:
        return DEFAULT_COALESCE_US
    return val if 0.0 <= val <= 1e6 else DEFAULT_COALESCE_US


def _maybe_enable_gpu(gpu_off: int, nslots: int) -> None:
    """At ring creation: turn GPU timing on per ``SGLSEAT_PROBE_GPU`` (auto: CUDA initialised here)."""
    mode = os.environ.get(ENV_GPU, "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return
    torch = sys.modules.get("torch")
    try:
        if torch is None:
            if mode in ("1", "on", "true", "yes"):
                torch = importlib.import_module("torch")
            else:
                return
        cuda = torch.cuda
        if not (cuda.is_initialized() if mode == "auto" else cuda.is_available()):
            return
        how = os.environ.get(ENV_GPU_PATH, "").strip() or DEFAULT_GPU_PATH
        try:
            paths = cuda_paths(torch, how, _gpu_timing())
        except Exception as exc:
            warn_once("gpu-path", f"event path {how!r} unavailable ({type(exc).__name__}: {exc}); using Event.record()")
            paths = cuda_paths(torch, "method", _gpu_timing())
        capturing = _graph_capture_hooks(torch) or cuda.is_current_stream_capturing
        timer = GpuTimer(paths.factory, capturing, gpu_off=gpu_off, nslots=nslots, poll_s=_gpu_poll_s(),
                         stream_key=paths.stream_key, record=paths.record, query=paths.query,
                         stream_idle=paths.stream_idle, thread_init=paths.thread_init, coalesce_us=_gpu_coalesce_us(),
                         event_time=paths.event_time)
        _fast_path(timer, paths, capturing)
        timer.prefill(min(PREFILL_EVENTS, nslots))
        timer.start()
        writer._GPU = timer
    except Exception as exc:
        warn_once("gpu", f"GPU stream timing not enabled ({type(exc).__name__}: {exc}); calls are timed on the host")


# Ring creation (in :mod:`writer`) starts GPU timing through this hook: the writer never imports this module.
writer._ON_RING = _maybe_enable_gpu
