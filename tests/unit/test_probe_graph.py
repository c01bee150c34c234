"""The probe around CUDA graph replay (issue 25): the wrapper, the in-flight rule and the report, on fakes.

SGLang decodes, and verifies the draft, by replaying CUDA graphs; the Engram host-table read is a kernel inside the
graph, with no Python of its own. The probe wraps the replay entry (``FullCudaGraphBackend.replay(self, shape_key,
static_forward_batch)``) and records CUDA events on the replay stream: an end event after each replay, a start event
before it where the previous replay on the stream was already seen done (else its start is bounded by that one's end;
``SGLSEAT_PROBE_GRAPH_START_EVENTS=always``: both events every replay). CI has no GPU,
so a fake backend shaped like SGLang's (``_cuda_graph_runner`` with ``captured_req_width`` and
``ragged_verify_mode``) and fake events (completed only when the test says so, in record order per stream, as a
stalled kernel keeps every later event of its stream pending) drive the real wrapper, ring and reader. The real
CUDA path is measured by ``bench/gpu/graph_cost.py`` and ``bench/gpu/gpu_watchdog.py --graphs``.
"""

from __future__ import annotations

import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from sgl_seat import probe
from sgl_seat.core import detect as d
from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import MetricsPoint, ProbeRecord, VerdictKind
from sgl_seat.engines import words_for
from sgl_seat.forensics.format.codec import decode_probe_records, encode_probe_records
from sgl_seat.forensics.replay.analysis import rowfetch_buckets
from sgl_seat.probe import graph, guard, ring
from sgl_seat.spec import WatchdogSpec
from tests.unit.conftest import probe_writer
from tests.unit.test_watchdog_probe_gpu import FakeEvent, FakeGpu

WORDS = words_for("sglang")


@dataclass(frozen=True)
class ShapeKey:
    """SGLang's ShapeKey (runner/shape_key.py): ``size`` counts requests for decode."""

    size: int


#: The paths every wrapper test runs on: the C wrapper with the C timer (``probe_native.c``, what a CUDA process
#: gets where it builds; its CUDA runtime calls are ctypes stand-ins over the fakes), the C wrapper with the Python
#: timer (timing events, or a runtime whose round trip failed), and the Python wrapper and timer (no C writer).
PATHS = ["native", "native-pytimer", "python"]


class CudaStandIn:
    """The CUDA runtime functions the C timer calls, as C function pointers (ctypes callbacks) over a FakeGpu: events
    are handles into ``events``, streams handles into ``streams``; ``cudaStreamIsCapturing`` says ``gpu.capturing``.
    A query that raises (``gpu.fail_query``) returns an error code, as the runtime would."""

    def __init__(self, g: FakeGpu) -> None:
        import ctypes

        self.g = g
        self.events: dict[int, FakeEvent] = {}
        self.streams: dict[int, object] = {}
        self.creates = 0
        self.capture_checks = 0
        self.null_calls = 0  # a record or query of a NULL event (a shared start has none: never asked about)

        def create(out: object, flags: int) -> int:
            self.creates += 1
            h = len(self.events) + 1
            self.events[h] = FakeEvent(g)
            out[0] = h  # type: ignore[index]
            return 0

        def record(ev: int, stream: int) -> int:
            if not ev:
                self.null_calls += 1
                return 1
            assert self.streams[stream or 0] is g.current, "the event goes on the replay's (current) stream"
            self.events[ev].record()
            return 0

        def query(ev: int) -> int:
            if not ev:
                self.null_calls += 1
                return 400  # cudaErrorInvalidResourceHandle
            try:
                return 0 if self.events[ev].query() else 600
            except RuntimeError:
                return 900  # cudaErrorStreamCaptureUnsupported-like: the event cannot be queried

        def is_capturing(stream: int, status: object) -> int:
            self.capture_checks += 1
            status[0] = 1 if g.capturing else 0  # type: ignore[index]
            return 0

        vp, i = ctypes.c_void_p, ctypes.c_int
        self._keep = [
            ctypes.CFUNCTYPE(i, ctypes.POINTER(vp), ctypes.c_uint)(create),
            ctypes.CFUNCTYPE(i, vp, vp)(record),
            ctypes.CFUNCTYPE(i, vp)(query),
            ctypes.CFUNCTYPE(i, vp, ctypes.POINTER(i))(is_capturing),
        ]
        self.addr = [ctypes.cast(f, vp).value or 0 for f in self._keep]

    def stream_handle(self, _device: object) -> int:
        """The current stream's handle (what ``torch._C._cuda_getCurrentRawStream(device)`` gives)."""
        for h, s in self.streams.items():
            if s is self.g.current:
                return h
        h = len(self.streams) + 1
        self.streams[h] = self.g.current
        return h


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    probe_writer("python" if request.param == "python" else "native", monkeypatch)
    return str(request.param)


@pytest.fixture
def ring_dir(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d_ = tmp_path / "rings"
    monkeypatch.setenv(probe.ENV_DIR, str(d_))
    monkeypatch.setenv(probe.ENV_SLOTS, "8")
    monkeypatch.setenv(probe.ENV_RANK, "1")
    monkeypatch.setenv(probe.ENV_GPU, "0")
    probe.reset()
    probe.writer._TARGET_NAMES.clear()
    graph.disable_graph()
    yield d_
    graph.disable_graph()
    probe.reset()
    probe.writer._TARGET_NAMES.clear()


def _backend_module(name: str, *, width: int, ragged: bool = False) -> types.ModuleType:
    """A module holding a backend shaped like SGLang's FullCudaGraphBackend (its replay 'launches' nothing)."""
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(f"""
        class Runner:
            captured_req_width = {width}
            ragged_verify_mode = {ragged}

        class Backend:
            def __init__(self):
                self._cuda_graph_runner = Runner()
                self.replays = 0

            def replay(self, shape_key, static_forward_batch, **kwargs):
                self.replays += 1
                hook = getattr(self, "hook", None)
                if hook is not None:
                    hook()  # the reader running while the replay has the GIL released
                return "out"
    """), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def _records() -> list[ProbeRecord]:
    path = probe.ring_file()
    assert path is not None
    return sorted(probe.read_ring(path, node=0, record=ProbeRecord), key=lambda r: r.seq)


def _install(name: str, width: int = 4, ragged: bool = False, *, path: str,
             captures: list[int] | None = None, start_events: str | None = None) -> tuple[types.ModuleType, FakeGpu]:
    mod = _backend_module(name, width=width, ragged=ragged)
    state = probe.install([f"{name}:Backend.replay@shape_key:graph"])
    assert state[f"{name}:Backend.replay@shape_key:graph"] == "installed"
    g = FakeGpu()
    timer: object
    if path == "native":
        cuda = CudaStandIn(g)
        g.cuda = cuda  # type: ignore[attr-defined]
        create, record, query, capturing = cuda.addr
        timer = graph.enable_graph_native([0] if captures is None else captures, cuda.stream_handle, 0,
                                          record=record, query=query, create=create, capturing=capturing,
                                          start_thread=False, start_events=start_events)
    else:
        timer = graph.enable_graph(lambda: FakeEvent(g), lambda: g.capturing, start_thread=False,
                                   stream_key=lambda: g.current, start_events=start_events)
    assert timer is not None
    assert isinstance(timer, graph.NativeReplayTimer) == (path == "native")
    return mod, g


def test_the_native_path_is_the_one_used_where_it_builds(path: str, ring_dir: Path) -> None:
    """Where the C writer builds (CI has a compiler: test_native_writer_builds_here), the installed replay entry is
    its GraphWrapper, not the Python wrapper; without it, the Python wrapper. (A C wrapper that stopped working would
    otherwise leave every test below passing on the Python one.)"""
    mod, _g = _install("fake_backend_path", path=path)
    wrapper = mod.Backend.__dict__["replay"]
    nat = probe.writer._native()
    if path == "python":
        assert nat is None and type(wrapper).__name__ == "function"
        assert graph.graph_path() == "python"
    else:
        assert nat is not None and isinstance(wrapper, nat.GraphWrapper), type(wrapper)
        assert graph.graph_path() == ("native" if path == "native" else "native wrapper, python timer")
    assert wrapper.__wrapped__.__name__ == "replay" and wrapper.__sgl_seat_probe__ == "fake_backend_path:Backend.replay"


def test_a_replay_is_one_record_with_its_token_count_shape_key_and_two_events(path: str, ring_dir: Path) -> None:
    """GIVEN a verify graph captured for 8 requests x 4 draft tokens WHEN it replays THEN one ring record says it
    was a graph replay of shape key 8 with 32 tokens, and two events went on the replay stream around it
    (the first replay on the stream: nothing is queued before it, so it records its own start event)."""
    mod, g = _install("fake_backend_a", width=4, path=path)
    backend = mod.Backend()
    assert backend.replay(ShapeKey(8), None) == "out" and backend.replays == 1
    assert len(g.current.recorded) == 2, "an event before and one after the replay"
    (rec,) = _records()
    assert rec.graph_replay and rec.graph_key == 8 and rec.gather_size == 32
    assert rec.target == "fake_backend_a:Backend.replay"
    assert rec.end is not None and rec.gpu and rec.gpu_start is None, "queued: its start event has not completed"


def test_the_reader_marks_a_replay_started_then_done_from_its_events(path: str, ring_dir: Path) -> None:
    """GIVEN a replayed graph WHEN only its start event completes THEN it is in flight on the GPU (a stalled kernel
    inside the graph); WHEN its end event completes too THEN it is done."""
    mod, g = _install("fake_backend_b", width=1, path=path)
    mod.Backend().replay(ShapeKey(16), None)
    timer = graph.replay_timer()
    assert timer is not None
    g.current.complete(1)
    assert timer.poll(now=1e12) == 1
    (rec,) = _records()
    assert rec.gather_size == 16 and rec.graph_key == 16
    assert rec.gpu_start is not None and rec.gpu_end is None and rec.gpu_in_flight(rec.gpu_start + 5.0)
    g.current.complete(1)
    assert timer.poll(now=2e12) == 0
    (rec,) = _records()
    assert rec.gpu_end is not None and not rec.gpu_in_flight(3e12)


def test_a_later_replay_waits_queued_behind_a_stalled_one(path: str, ring_dir: Path) -> None:
    """GIVEN two replays on one stream WHEN the first's end never comes THEN the second is queued, not in flight
    (its work waits behind the stall), so only the stalled replay ages."""
    mod, g = _install("fake_backend_c", width=2, path=path)
    b = mod.Backend()
    b.replay(ShapeKey(4), None)
    b.replay(ShapeKey(8), None)
    g.current.complete(1)  # the first replay's start event only
    timer = graph.replay_timer()
    assert timer is not None and timer.poll(now=1e12) == 2
    first, second = _records()
    assert first.gpu_start is not None and first.gpu_end is None
    assert second.gpu_start is None, "queued behind the stalled replay"
    assert (first.gather_size, second.gather_size) == (8, 16)


def test_no_event_is_recorded_while_a_graph_is_captured(path: str, ring_dir: Path) -> None:
    """GIVEN a graph being captured WHEN the replay entry runs THEN no event is recorded (it would belong to the
    captured graph: FakeEvent.record asserts it) and the call is recorded with host timing only."""
    mod, g = _install("fake_backend_d", width=1, path=path)
    g.capturing = True
    mod.Backend().replay(ShapeKey(2), None)
    assert g.current.recorded == []
    (rec,) = _records()
    assert rec.graph_key == 2 and not rec.gpu


@pytest.fixture
def native_only(path: str) -> None:
    if path != "native":
        pytest.skip("the C timer's own behaviour (the tests above run every path)")


def test_the_c_timer_skips_events_while_the_hooks_count_a_capture(native_only: None, path: str,
                                                                   ring_dir: Path) -> None:
    """GIVEN torch's capture hooks counting a capture in progress (their list, read by the C side) WHEN a replay runs
    THEN no event is recorded, and the stream is not even asked (the count is tested first)."""
    captures = [1]
    mod, g = _install("fake_backend_e", width=1, path=path, captures=captures)
    mod.Backend().replay(ShapeKey(2), None)
    assert g.current.recorded == [] and g.cuda.capture_checks == 0  # type: ignore[attr-defined]
    captures[0] = 0
    mod.Backend().replay(ShapeKey(2), None)
    assert len(g.current.recorded) == 2
    first, second = _records()
    assert not first.gpu and second.gpu


def test_the_c_timer_reuses_its_events_and_bounds_its_queue(native_only: None, path: str, ring_dir: Path) -> None:
    """GIVEN replays resolved by the reader WHEN more replay THEN their events come from the pool (no new ones made);
    GIVEN a stalled stream WHEN more replays than the ring has slots are unresolved THEN the rest go untimed (the
    bound of ReplayTimer.before), and nothing raises."""
    mod, g = _install("fake_backend_f", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    for _ in range(3):
        b.replay(ShapeKey(1), None)
        g.current.complete(2)
        assert timer.poll(now=1e12) == 0
    assert g.cuda.creates == 2, "one pair made, then reused"  # type: ignore[attr-defined]
    assert timer.recorded == 3 and timer.errors == 0
    for _ in range(12):  # the ring has 8 slots: 8 replays queue, the others run untimed
        b.replay(ShapeKey(1), None)
    assert timer.poll(now=1e12) == 8 and timer.recorded == 11
    g.current.complete(10**6)
    assert timer.poll(now=2e12) == 0


def test_a_query_that_fails_drops_that_streams_replays_untimed(native_only: None, path: str, ring_dir: Path) -> None:
    """GIVEN a query the runtime refuses WHEN the reader polls THEN the stream's replays go untimed (GPU state none),
    the error is counted, and the poll does not raise."""
    mod, g = _install("fake_backend_g", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    b.replay(ShapeKey(1), None)
    b.replay(ShapeKey(1), None)
    g.fail_query = True
    assert timer.poll(now=1e12) == 0 and timer.errors == 1
    assert [r.gpu for r in _records()] == [False, False]


def test_the_python_wrapper_drives_the_c_timer_too(native_only: None, path: str, ring_dir: Path) -> None:
    """The fallback wrapper in a process whose timer is the C one (the bench's Python arm) records the same pair
    through the timer's before/after."""
    _mod, g = _install("fake_backend_h", width=4, path=path)
    mod = _backend_module("fake_backend_h2", width=4)
    spec = probe.parse_target("fake_backend_h2:Backend.replay@shape_key:graph")
    wrapped = graph.make_graph_wrapper(mod.Backend.replay, spec, python=True)
    assert type(wrapped).__name__ == "function"
    assert wrapped(mod.Backend(), ShapeKey(8), None) == "out"
    assert len(g.current.recorded) == 2
    timer = graph.replay_timer()
    assert timer is not None
    g.current.complete(2)
    assert timer.poll(now=1e12) == 0
    (rec,) = _records()
    assert rec.gather_size == 32 and rec.graph_key == 8 and rec.gpu_end is not None


# ---- one event per replay in steady state (the start bounded by the previous replay's end) ----------------------

def _stats(timer: object) -> tuple[int, int, int]:
    """(replays timed, start events recorded, starts bounded by the previous end) of either timer."""
    return timer.recorded, timer.start_events, timer.start_shared  # type: ignore[attr-defined]


def _null_calls(g: FakeGpu) -> int:
    cuda = getattr(g, "cuda", None)
    return 0 if cuda is None else int(cuda.null_calls)


def test_a_burst_ahead_of_the_gpu_records_one_start_event(path: str, ring_dir: Path) -> None:
    """GIVEN the fake GPU behind the host (nothing completes) WHEN 5 replays are launched THEN 6 events went on the
    stream: one start event (the first replay's: nothing was queued) and 5 end events; the other 4 starts are bounded
    by their predecessor's end. No NULL event is ever recorded or queried."""
    mod, g = _install("fake_backend_j", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    for _ in range(5):
        b.replay(ShapeKey(2), None)
    assert len(g.current.recorded) == 6, "one start event, then one end event per replay"
    assert _stats(timer) == (5, 1, 4)
    assert timer.poll(now=1e12) == 5
    assert [r.gpu_start for r in _records()] == [None] * 5, "all queued: nothing completed"
    g.current.complete(10**6)
    assert timer.poll(now=2e12) == 0
    assert all(r.gpu_end is not None for r in _records()) and timer.errors == 0 and _null_calls(g) == 0


def test_two_events_per_replay_where_the_switch_says_always(path: str, ring_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN SGLSEAT_PROBE_GRAPH_START_EVENTS=always (the bench's two-event arm) WHEN 5 replays run ahead of the GPU
    THEN 10 events: a start and an end per replay, as before the change."""
    monkeypatch.setenv(graph.ENV_GRAPH_START_EVENTS, "always")
    mod, g = _install("fake_backend_k", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None and timer.start_events_mode == "always"
    for _ in range(5):
        b.replay(ShapeKey(2), None)
    assert len(g.current.recorded) == 10
    assert _stats(timer) == (5, 5, 0)
    g.current.complete(3)  # the first replay's pair, the second's start event
    assert timer.poll(now=1e12) == 4
    first, second, *rest = _records()
    assert first.gpu_end is not None and second.gpu_start is not None and second.gpu_end is None
    assert all(r.gpu_start is None for r in rest)


def test_the_start_switch_defaults_to_shared_and_reads_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(graph.ENV_GRAPH_START_EVENTS, raising=False)
    assert graph.start_events_mode() == "shared"
    assert graph.start_events_mode("always") == "always" == graph.start_events_mode(" Always ")
    assert graph.start_events_mode("shared") == "shared" == graph.start_events_mode("bogus")
    monkeypatch.setenv(graph.ENV_GRAPH_START_EVENTS, "always")
    assert graph.start_events_mode() == "always"


def test_a_shared_start_is_started_when_its_predecessor_is_seen_done(path: str, ring_dir: Path) -> None:
    """GIVEN two replays, the second without a start event WHEN the first is only started THEN the second stays
    queued; WHEN the first's end is seen done at T1 THEN the second is started, from max(its host launch, T1), and
    it stays started (in flight) until its own end; its published start never moves after that."""
    mod, g = _install("fake_backend_l", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    b.replay(ShapeKey(1), None)
    b.replay(ShapeKey(1), None)
    assert _stats(timer) == (2, 1, 1) and len(g.current.recorded) == 3
    g.current.complete(1)  # the first replay's start event
    first, second = _records()
    t0 = second.start + 50.0
    assert timer.poll(now=t0) == 2
    first, second = _records()
    assert first.gpu_start == pytest.approx(t0) and first.gpu_end is None
    assert second.gpu_start is None, "queued: its predecessor has not ended"
    g.current.complete(1)  # the first replay's end event
    t1 = t0 + 7.0
    assert timer.poll(now=t1) == 1
    first, second = _records()
    assert first.gpu_end == pytest.approx(t1)
    assert second.gpu_start is not None and second.gpu_end is None
    assert second.gpu_start >= second.start and second.gpu_start >= t1
    assert second.gpu_start == pytest.approx(max(second.start, t1))
    assert second.gpu_in_flight(t1 + 1.0)
    assert timer.poll(now=t1 + 2.0) == 1
    assert _records()[1].gpu_start == pytest.approx(t1), "the start is published once"
    g.current.complete(1)
    assert timer.poll(now=t1 + 3.0) == 0
    second = _records()[1]
    assert second.gpu_start == pytest.approx(t1) and second.gpu_end == pytest.approx(t1 + 3.0)
    assert _null_calls(g) == 0, "a replay without a start event: its start is never queried"


def test_a_shared_start_done_in_the_same_poll_as_its_predecessor(path: str, ring_dir: Path) -> None:
    """GIVEN three replays (one start event) all complete before one poll at T THEN all are done, each start at
    max(its host launch, T) and none after its end."""
    mod, g = _install("fake_backend_m", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    for _ in range(3):
        b.replay(ShapeKey(1), None)
    g.current.complete(10)
    t = _records()[-1].start + 1.0
    assert timer.poll(now=t) == 0
    for r in _records():
        assert r.gpu_start == pytest.approx(max(r.start, t)) and r.gpu_end == pytest.approx(t)


def test_the_stall_behind_a_completed_replay_ages_from_when_that_one_was_seen_done(path: str,
                                                                                  ring_dir: Path) -> None:
    """GIVEN a replay that completed (seen done at T1) and the next one, with no start event of its own, stalled on
    the GPU WHEN the detectors ask THEN the stalled one is in flight from T1 (not from its host launch: an idle gap
    before it would otherwise age it), late past the 3 s threshold only at T1 + 3 s, and the replay behind it queued."""
    mod, g = _install("fake_backend_n", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    for _ in range(3):
        b.replay(ShapeKey(8), None)
    assert _stats(timer) == (3, 1, 2)
    g.current.complete(2)  # the first replay: its start and end events; the second never ends
    t1 = _records()[-1].start + 100.0  # an idle gap of 100 s between the launches and the first's end being seen
    assert timer.poll(now=t1) == 2
    done, stalled, behind = _records()
    assert done.gpu_end == pytest.approx(t1)
    assert stalled.gpu_start == pytest.approx(t1) and behind.gpu_start is None
    assert stalled.inflight_age(t1 + 2.5) == pytest.approx(2.5)
    assert behind.inflight_age(t1 + 2.5) is None, "queued behind the stall: not in flight"
    pc = ProbeColumns.from_records([done, stalled, behind])
    th = TH.rowfetch_inflight_s
    assert np.isnan(pc.late_since(t1 + th - 0.1, th)).all()
    late = pc.late_since(t1 + th + 0.1, th)
    assert np.isnan(late[[0, 2]]).all() and late[1] == pytest.approx(t1)


def test_after_a_dropped_predecessor_the_follower_is_not_started_before_its_end(path: str, ring_dir: Path) -> None:
    """GIVEN a replay launched while its predecessor is unresolved (no start event of its own) WHEN the predecessor
    is dropped (its query fails) while the replay runs THEN the follower has no start knowledge: it stays queued,
    never in flight, until its own end completes, and then it is done. The next replay records its own start."""
    mod, g = _install("fake_backend_o", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    b.replay(ShapeKey(1), None)  # the predecessor: start and end events

    def drop_predecessor() -> None:
        g.fail_query = True
        timer.poll(now=1e12)
        g.fail_query = False

    b.hook = drop_predecessor
    b.replay(ShapeKey(1), None)  # the follower: its end event only
    b.hook = None
    assert _stats(timer) == (2, 1, 1) and timer.errors == 1
    dropped, follower = _records()
    assert not dropped.gpu and follower.gpu and follower.gpu_start is None
    g.current.complete(2)  # the dropped one's events; the follower's end has not completed
    assert timer.poll(now=2e12) == 1
    follower = _records()[1]
    assert follower.gpu_start is None and follower.inflight_age(3e12) is None, "no invented start"
    g.current.complete(1)
    assert timer.poll(now=4e12) == 0
    follower = _records()[1]
    assert follower.gpu_start == pytest.approx(4e12) and follower.gpu_end == pytest.approx(4e12)
    b.replay(ShapeKey(1), None)
    assert _stats(timer) == (3, 2, 1), "nothing unresolved on the stream: its own start event"
    assert _null_calls(g) == 0


def test_a_stream_dropped_together_leaves_nothing_behind(path: str, ring_dir: Path) -> None:
    """GIVEN a burst sharing starts WHEN a query fails THEN every replay of the stream goes untimed, and the next
    replay records its own start event (nothing of that stream is unresolved)."""
    mod, g = _install("fake_backend_p", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    for _ in range(3):
        b.replay(ShapeKey(1), None)
    g.fail_query = True
    assert timer.poll(now=1e12) == 0
    g.fail_query = False
    assert [r.gpu for r in _records()] == [False, False, False]
    b.replay(ShapeKey(1), None)
    assert _stats(timer) == (4, 2, 2)
    g.current.complete(10**6)
    assert timer.poll(now=2e12) == 0 and _records()[-1].gpu_end is not None and _null_calls(g) == 0


def test_a_predecessor_seen_done_while_the_replay_runs_still_bounds_its_start(path: str, ring_dir: Path) -> None:
    """GIVEN a replay launched while its predecessor was unresolved WHEN the reader sees the predecessor done while
    the replay runs (the GIL released), at a time before the replay's host launch THEN at the next poll the replay
    is started from its host launch (the later of the two), not left queued."""
    mod, g = _install("fake_backend_q", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    b.replay(ShapeKey(1), None)

    def resolve_predecessor() -> None:
        g.current.complete(2)
        assert timer.poll(now=1.0) == 0  # 1970: before any host launch

    b.hook = resolve_predecessor
    b.replay(ShapeKey(1), None)
    b.hook = None
    assert _stats(timer) == (2, 1, 1)
    assert timer.poll(now=2e12) == 1
    _first, second = _records()
    assert second.gpu_start == pytest.approx(second.start) and second.gpu_end is None


def test_each_stream_bounds_its_own_replays(path: str, ring_dir: Path) -> None:
    """GIVEN replays alternating on two streams, the GPU behind WHEN they launch THEN each stream records one start
    event; WHEN only the first stream's first replay completes THEN that stream's second replay is started and the
    other stream's are unchanged (its first started from its own start event only once that completes)."""
    mod, g = _install("fake_backend_r", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    s0, s1 = g.stream("s0"), g.stream("s1")
    for s in (s0, s1, s0, s1):
        g.current = s
        b.replay(ShapeKey(1), None)
    assert (len(s0.recorded), len(s1.recorded)) == (3, 3)
    assert _stats(timer) == (4, 2, 2)
    s0.complete(2)
    t = _records()[-1].start + 5.0
    assert timer.poll(now=t) == 3
    a0, a1, b0, b1 = _records()
    assert a0.gpu_end is not None and b0.gpu_start == pytest.approx(t) and b0.gpu_end is None
    assert a1.gpu_start is None and b1.gpu_start is None
    s1.complete(1)
    assert timer.poll(now=t + 1.0) == 3
    a1 = _records()[1]
    assert a1.gpu_start == pytest.approx(t + 1.0) and _records()[3].gpu_start is None


def test_a_replay_queued_in_between_keeps_a_later_one_queued(path: str, ring_dir: Path) -> None:
    """GIVEN a replay whose start is bounded by its predecessor P, and another replay queued on the same stream
    between its launch and its end (another thread's, here a nested one) WHEN only P completes THEN the one queued
    in between is started and the later one stays queued behind it (both were bounded by P's end)."""
    mod, g = _install("fake_backend_t", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert timer is not None
    b.replay(ShapeKey(1), None)  # P

    def nested() -> None:
        b.hook = None
        b.replay(ShapeKey(2), None)  # queued while the outer replay runs

    b.hook = nested
    b.replay(ShapeKey(3), None)
    assert _stats(timer) == (3, 1, 2)
    g.current.complete(2)  # P's start and end
    t = max(r.start for r in _records()) + 1.0
    assert timer.poll(now=t) == 2
    recs = {r.graph_key: r for r in _records()}
    assert recs[1].gpu_end is not None
    assert recs[2].gpu_start == pytest.approx(t), "the one queued in between: next on the stream"
    assert recs[3].gpu_start is None, "behind an unresolved replay of its stream: queued"
    g.current.complete(1)
    assert timer.poll(now=t + 1.0) == 1
    recs = {r.graph_key: r for r in _records()}
    assert recs[2].gpu_end is not None and recs[3].gpu_start == pytest.approx(t + 1.0)


def test_the_c_timer_pools_only_real_events(native_only: None, path: str, ring_dir: Path) -> None:
    """GIVEN bursts sharing their starts WHEN the reader resolves them THEN exactly the events made go back to the
    pool (no NULL for a start that had none), and later replays make none."""
    mod, g = _install("fake_backend_s", width=1, path=path)
    b, timer = mod.Backend(), graph.replay_timer()
    assert isinstance(timer, graph.NativeReplayTimer)
    for _ in range(4):
        b.replay(ShapeKey(1), None)
    g.current.complete(10**6)
    assert timer.poll(now=1e12) == 0
    st = probe.writer._native().graph_stats()  # type: ignore[union-attr]
    assert st["created"] == 5 and st["pool"] == 5 and st["start_events"] == 1 and st["start_shared"] == 3
    for _ in range(4):
        b.replay(ShapeKey(1), None)
    g.current.complete(10**6)
    assert timer.poll(now=2e12) == 0
    st = probe.writer._native().graph_stats()  # type: ignore[union-attr]
    assert st["created"] == 5 and st["pool"] == 5 and st["always"] == 0
    assert g.cuda.creates == 5 and _null_calls(g) == 0  # type: ignore[attr-defined]


def test_the_runner_width_is_read_once_per_owner(path: str, ring_dir: Path) -> None:
    """Both wrappers cache the runner's width per backend object: a second backend with another width gets its own,
    and a key without an integer size is still one record (gather size -1, no key)."""
    mod, _g = _install("fake_backend_i", width=4, path=path)
    narrow = mod.Backend()
    narrow._cuda_graph_runner = types.SimpleNamespace(captured_req_width=2, ragged_verify_mode=False)
    mod.Backend().replay(ShapeKey(8), None)
    narrow.replay(ShapeKey(8), None)
    narrow.replay(shape_key=ShapeKey(3), static_forward_batch=None)
    mod.Backend().replay("bs8", None)
    recs = _records()
    assert [(r.gather_size, r.graph_key) for r in recs] == [(32, 8), (16, 8), (6, 3), (-1, None)]


def test_ragged_verify_counts_tokens_in_the_key_itself() -> None:
    """SGLang's ragged verify keys its graphs by tokens (ShapeKey.size is the token count): no width applies."""
    ragged = types.SimpleNamespace(_cuda_graph_runner=types.SimpleNamespace(captured_req_width=4,
                                                                            ragged_verify_mode=True))
    plain = types.SimpleNamespace(_cuda_graph_runner=types.SimpleNamespace(captured_req_width=4,
                                                                           ragged_verify_mode=False))
    assert graph.replay_shape(ragged, ShapeKey(96)) == (96, 96)
    assert graph.replay_shape(plain, ShapeKey(24)) == (96, 24)
    assert graph.replay_shape(object(), 5) == (5, 5)
    with pytest.raises(TypeError):
        graph.replay_shape(plain, "bs8")


# --- links: a backend that does not keep its runner (SGLang 0.5.17) ---------------------------------------------

#: SGLang 0.5.17's FullCudaGraphBackend.__init__ takes the runner and drops it; "Kept" is 0.5.23's, which keeps it.
LINK_SRC = """
    class Runner:
        def __init__(self, width):
            self.captured_req_width = width
            self.ragged_verify_mode = False

    class FullCudaGraphBackend:
        def __init__(self, cuda_graph_runner, *, enable_memory_saver=False):
            self._graphs = {}
            self.made_with = cuda_graph_runner.captured_req_width

        def replay(self, shape_key, static_forward_batch, **kwargs):
            return "out"

    class Kept(FullCudaGraphBackend):
        def __init__(self, cuda_graph_runner, *, enable_memory_saver=False):
            self._cuda_graph_runner = cuda_graph_runner

    class Slotted:
        __slots__ = ("made",)
        def __init__(self, cuda_graph_runner):
            self.made = True

    class Failing:
        def __init__(self, cuda_graph_runner):
            raise RuntimeError("no TP group")
"""


def _link_module(name: str, targets: list[str]) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(LINK_SRC), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    full = [f"{name}:{t}" for t in targets]
    state = probe.install(full)
    assert all(state[t] == "installed" for t in full), state
    return mod


LINK = "FullCudaGraphBackend.__init__@cuda_graph_runner:link"
REPLAY = "FullCudaGraphBackend.replay@shape_key:graph"


@pytest.fixture
def host_only(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Replays timed on the host only (no CUDA events): what a link changes is the record's size."""
    monkeypatch.setenv(graph.ENV_GRAPH, "0")
    monkeypatch.setattr(guard, "_WARNED", set())
    return ring_dir


def test_a_link_gives_a_backend_its_runner_so_a_verify_replay_counts_its_tokens(path: str, host_only: Path) -> None:
    """GIVEN a backend whose __init__ drops its runner (SGLang 0.5.17) and a runner that captured 4 draft tokens per
    request WHEN the link and the replay are installed and 3 requests replay THEN the record holds 12 tokens, with
    the runner passed by position or by name; the constructor itself writes no record."""
    mod = _link_module("fake_link_a", [LINK, REPLAY])
    runner = mod.Runner(4)
    b = mod.FullCudaGraphBackend(runner)
    assert b._cuda_graph_runner is runner and b.made_with == 4
    assert b.replay(ShapeKey(3), None) == "out"
    by_name = mod.FullCudaGraphBackend(cuda_graph_runner=mod.Runner(2), enable_memory_saver=True)
    by_name.replay(ShapeKey(3), None)
    assert [(r.gather_size, r.graph_key, r.target) for r in _records()] == [
        (12, 3, "fake_link_a:FullCudaGraphBackend.replay"), (6, 3, "fake_link_a:FullCudaGraphBackend.replay")]


def test_without_the_link_the_same_replay_counts_requests(path: str, host_only: Path) -> None:
    mod = _link_module("fake_link_b", [REPLAY])
    b = mod.FullCudaGraphBackend(mod.Runner(4))
    assert not hasattr(b, "_cuda_graph_runner")
    b.replay(ShapeKey(3), None)
    assert [(r.gather_size, r.graph_key) for r in _records()] == [(3, 3)]


def test_a_link_leaves_a_runner_the_backend_kept(path: str, host_only: Path) -> None:
    """SGLang 0.5.23's backends keep their runner: the link changes nothing there (nor where one was set before)."""
    mod = _link_module("fake_link_c", [LINK, REPLAY, "Kept.__init__@cuda_graph_runner:link"])
    own = mod.Runner(2)
    kept = mod.Kept(own)
    assert kept._cuda_graph_runner is own
    kept.replay(ShapeKey(3), None)
    (rec,) = _records()
    assert rec.gather_size == 6
    preset = object.__new__(mod.FullCudaGraphBackend)
    preset._cuda_graph_runner = own
    mod.FullCudaGraphBackend.__init__(preset, mod.Runner(4))
    assert preset._cuda_graph_runner is own


def test_a_link_is_installed_once_and_wraps_the_constructor_itself(path: str, host_only: Path) -> None:
    mod = _link_module("fake_link_d", [LINK])
    init = mod.FullCudaGraphBackend.__dict__["__init__"]
    assert init.__sgl_seat_probe__ == "fake_link_d:FullCudaGraphBackend.__init__"
    assert probe.install([f"fake_link_d:{LINK}"])[f"fake_link_d:{LINK}"] == "installed"
    probe.installer._wrap_in(mod, probe.parse_target(f"fake_link_d:{LINK}"))  # installed again by hand: no-op
    assert mod.FullCudaGraphBackend.__dict__["__init__"] is init
    assert init.__wrapped__.__qualname__ == "FullCudaGraphBackend.__init__" and not hasattr(
        init.__wrapped__, "__sgl_seat_probe__")
    import inspect

    assert list(inspect.signature(init).parameters) == ["self", "cuda_graph_runner", "enable_memory_saver"]


def test_a_link_never_raises_into_the_engine(path: str, host_only: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN an instance that refuses the attribute, or a link naming a parameter the constructor does not have
    WHEN the constructor runs THEN it returns as it would have, the failure warned about once per target (and the
    link makes no ring: it is no probe record); a constructor's own exception is its own and propagates unchanged."""
    n = "fake_link_e"
    mod = _link_module(n, ["Slotted.__init__@cuda_graph_runner:link", "FullCudaGraphBackend.__init__@runner:link",
                           "Kept.__init__@runner:link", "Failing.__init__@cuda_graph_runner:link"])
    for _ in range(2):
        assert mod.Slotted(mod.Runner(4)).made
        assert not hasattr(mod.FullCudaGraphBackend(mod.Runner(4)), "_cuda_graph_runner")
        assert mod.Kept(mod.Runner(4))._cuda_graph_runner.captured_req_width == 4
    with pytest.raises(TypeError):
        mod.Slotted.__init__()  # no instance: the original's own TypeError, as without the probe
    with pytest.raises(RuntimeError, match="no TP group"):
        mod.Failing(mod.Runner(4))
    err = capsys.readouterr().err
    assert err.count(f"{n}:Slotted.__init__@cuda_graph_runner:link: runner not linked") == 1, err
    assert err.count(f"{n}:FullCudaGraphBackend.__init__@runner:link: runner not linked") == 1, err
    assert "Kept.__init__" not in err, "a backend that kept its runner needs no argument looked up"
    assert probe.ring_file() is None


def test_a_link_needs_the_runners_parameter() -> None:
    with pytest.raises(ValueError, match="names the runner's parameter"):
        probe.parse_target("m:Backend.__init__@:link")
    t = probe.parse_target("m:Backend.__init__@1:link")
    assert t.runner_link and not t.graph_replay and t.size_arg == 1


def test_the_target_word_carries_the_graph_flag_and_key() -> None:
    assert ring.split_target_word(ring.target_word(3)) == (3, None)
    assert ring.split_target_word(ring.target_word(3, 48)) == (3, 48)
    assert ring.split_target_word(ring.target_word(29, 1 << 40)) == (29, ring.GRAPH_KEY_MAX)


def test_graph_records_survive_the_bundle_codec() -> None:
    """The shape key is a group field of the probe blocks: it round-trips, and eager rows stay keyless."""
    recs = [_rec(0, 1, 10.0, graph_key=None, gs=64), _rec(0, 2, 10.1, graph_key=8, gs=32),
            _rec(0, 3, 10.2, graph_key=16, gs=64)]
    cols = decode_probe_records(__import__("io").BytesIO(encode_probe_records(recs)), "probe.jsonl")
    back = sorted(cols, key=lambda r: r.seq)
    assert [r.graph_key for r in back] == [None, 8, 16]
    assert back == recs


# ---- the in-flight rule and the report ---------------------------------------------------------------

TH = WatchdogSpec()
T0 = 3_000_000.0
STALL_AT = T0 + 20.0
TARGET = "sgl_seat.sim.graphs:SimGraphBackend.replay"


def _rec(rank: int, seq: int, start: float, *, graph_key: int | None, gs: int, gpu_end: float | None = -1.0,
         target: str = TARGET) -> ProbeRecord:
    end = start + 0.00002
    return ProbeRecord(node=rank, rank=rank, pid=100 + rank, thread=1, seq=seq, target=target, start=start, end=end,
                       gather_size=gs, gpu=True, gpu_start=start + 0.0001,
                       gpu_end=start + 0.004 if gpu_end == -1.0 else gpu_end, graph_key=graph_key)


def _seat(now: float) -> Observation:
    """Two ranks replaying decode graphs (bs 8 x 4 draft tokens) every 20 ms; at STALL_AT rank 1's replay never
    ends on the GPU; its host call returned at once, as a replay's does."""
    probes: list[ProbeRecord] = []
    seq, t = 1, T0
    while t < STALL_AT:
        for r in (0, 1):
            probes.append(_rec(r, seq, t, graph_key=8, gs=32))
        seq, t = seq + 1, t + 0.02
    probes.append(_rec(0, seq, STALL_AT, graph_key=8, gs=32))
    probes.append(_rec(1, seq, STALL_AT, graph_key=8, gs=32, gpu_end=None))
    pts = [MetricsPoint(t=T0 + i, node=0, values={"sglang:num_running_reqs": 8.0,
                                                   "sglang:generation_tokens_total": 100.0 * min(T0 + i, STALL_AT)})
           for i in range(int(now - T0) + 1)]
    return Observation.of(words=WORDS, rank_nodes={0: 0, 1: 1}, probes=probes, samples=[], metrics=pts)


def test_a_graph_replay_in_flight_on_the_gpu_names_its_rank() -> None:
    """GIVEN rank 1's replayed graph stalled on the GPU past the threshold WHEN the detectors run THEN the verdict is
    a row-fetch stall on rank 1 that says "in flight on the GPU: graph replay, 32 tokens" and its shape key."""
    now = STALL_AT + TH.rowfetch_inflight_s + 0.5
    v = d.detect(_seat(now), TH, now)
    assert v is not None and v.kind == VerdictKind.ROWFETCH_STALL and v.rank == 1 and v.node == 1
    assert "in flight on the GPU: graph replay, 32 tokens, shape key 8" in v.evidence[0], v.evidence
    assert v.frame is not None and "[GPU record: graph replay, 32 tokens, shape key 8]" in v.frame


def test_a_graph_replay_younger_than_the_threshold_is_no_verdict_yet() -> None:
    now = STALL_AT + TH.rowfetch_inflight_s - 0.5
    v = d.detect(_seat(now), TH, now)
    assert v is None or v.kind != VerdictKind.ROWFETCH_STALL


@dataclass
class _Bundle:
    probes: ProbeColumns


def test_the_report_tables_graph_replays_by_token_bucket_beside_eager_fetches() -> None:
    """GIVEN eager fetches and graph replays of two shapes, one replay stalled on the GPU WHEN the row-fetch table is
    made THEN eager fetches stay in ``buckets``, replays go to ``graph_buckets`` by token count with their shape keys,
    and the stalled replay is listed in flight with its key, aged from its GPU start."""
    recs = [_rec(0, i, T0 + i * 0.01, graph_key=None, gs=5, target="sgl_seat.sim.rowfetch:fetch_rows")
            for i in range(1, 11)]
    recs += [_rec(0, 100 + i, T0 + i * 0.01, graph_key=8, gs=32) for i in range(10)]
    recs += [_rec(0, 200 + i, T0 + i * 0.01, graph_key=16, gs=64) for i in range(10)]
    recs.append(_rec(1, 300, T0 + 1.0, graph_key=16, gs=64, gpu_end=None))
    now = T0 + 6.0
    rf = rowfetch_buckets(_Bundle(ProbeColumns.from_records(recs)), now, stall_s=3.0)
    # (process 0's call 1 is here: its first calls of each shape are warm-up calls, counted apart)
    assert [(b["gather_size_min"], b["count"] + b["warmup"]) for b in rf["buckets"]] == [(4, 10)]
    assert rf["graph_replays"] == 21 and rf["graph_in_flight"] == 1
    g = {b["gather_size_min"]: b for b in rf["graph_buckets"]}
    assert g[32]["shape_keys"] == [8] and g[32]["count"] + g[32]["warmup"] == 10 and g[32]["in_flight"] == 0
    assert g[64]["shape_keys"] == [16] and g[64]["count"] + g[64]["warmup"] == 11 and g[64]["stalled"]
    # A replay's latency is its GPU time between the events (3.9 ms), not its host launch (0.02 ms).
    assert g[32]["p50_ms"] == pytest.approx(3.9, abs=0.01)
    (stalled,) = [f for f in rf["in_flight_fetches"] if f.get("graph_key") is not None]
    assert stalled["rank"] == 1 and stalled["on_gpu"] and stalled["gather_size"] == 64
    assert stalled["age_ms"] == pytest.approx((now - (T0 + 1.0001)) * 1000, abs=1)
    assert rf["in_flight"] == 0, "no host call is in flight: the replay call returned"


def test_a_seat_without_graph_replays_keeps_the_table_it_had() -> None:
    recs = [_rec(0, i, T0 + i * 0.01, graph_key=None, gs=5, target="sgl_seat.sim.rowfetch:fetch_rows")
            for i in range(1, 6)]
    rf = rowfetch_buckets(_Bundle(ProbeColumns.from_records(recs)), T0 + 1.0, stall_s=3.0)
    assert not any(k.startswith("graph") for k in rf)
    assert np.isclose(rf["buckets"][0]["count"] + rf["buckets"][0]["warmup"], 5)


@pytest.mark.skipif(not __import__("importlib").util.find_spec("torch") or
                    not __import__("torch").cuda.is_available(),
                    reason="no CUDA device here (CI has none): the fake-event tests above cover the logic; "
                           "bench/gpu/graph_cost.py and gpu_watchdog.py --graphs run it on a GPU machine")
def test_real_cuda_graph_replay_is_timed(ring_dir: Path) -> None:  # pragma: no cover - GPU only
    """GIVEN a real captured graph behind the wrapped replay entry WHEN it replays and the device syncs THEN the
    reader resolves both real events: the record is done with GPU times."""
    import torch

    mod = types.ModuleType("real_graph_backend")
    exec(compile(textwrap.dedent("""
        class Backend:
            def __init__(self, g):
                self.g = g

            def replay(self, shape_key, static_forward_batch):
                self.g.replay()
    """), "<real_graph_backend>", "exec"), mod.__dict__)
    sys.modules["real_graph_backend"] = mod
    probe.install(["real_graph_backend:Backend.replay@shape_key:graph"])
    x = torch.zeros(16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    torch.cuda.synchronize()
    mod.Backend(g).replay(ShapeKey(16), None)
    torch.cuda.synchronize()
    timer = graph.replay_timer()
    assert timer is not None and timer.poll() == 0
    (rec,) = _records()
    assert rec.graph_key == 16 and rec.gather_size == 16 and rec.gpu_end is not None
    assert float(x[0]) == 1.0
