"""The probe on the GPU stream: one CUDA event after each wrapped call, resolved off the hot path into the ring.

A fake event object stands in for ``torch.cuda.Event`` (CI has no GPU): a :class:`FakeGpu` completes the events
recorded on each of its streams only when the test says so, in record order, the way a stalled kernel keeps
every later event of its stream pending. The start of a call's GPU work is a bound (the later of the host call's
start and the previous probed end seen on the same stream), so these tests use the records' real host times.
One test at the end uses real CUDA events and is skipped, saying why, where torch sees no GPU.
"""

from __future__ import annotations

import ctypes
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from sgl_seat import probe
from sgl_seat.core.records import ProbeRecord
from tests.unit.conftest import probe_writer


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.recorded: list[FakeEvent] = []
        self.done = 0  # events [0, done) have completed
        self.idle = False  # all work on the stream completed (cudaStreamQuery)

    def complete(self, n: int, at: float | None = None) -> None:
        """The GPU gets past the next ``n`` recorded events of this stream (at wall time ``at``, if given)."""
        for ev in self.recorded[self.done:self.done + n]:
            ev.done_at = at
        self.done = min(len(self.recorded), self.done + n)


class FakeGpu:
    """Streams, the current one, a capture flag, and how many times anything queried an event."""

    def __init__(self) -> None:
        self.streams = {"s0": FakeStream("s0")}
        self.current = self.streams["s0"]
        self.capturing = False
        self.queries = 0
        self.fail_query = False

    def stream(self, name: str) -> FakeStream:
        return self.streams.setdefault(name, FakeStream(name))


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.stream: FakeStream | None = None
        self.index = -1
        self.done_at: float | None = None  # what a timing event's elapsed time would give

    def record(self) -> FakeStream:
        """Record on the current stream; the stream is the timer's key for it (the raw handle in CUDA)."""
        assert not self.gpu.capturing, "an event recorded while a graph is captured belongs to the graph"
        self.stream = self.gpu.current
        self.index = len(self.stream.recorded)
        self.stream.recorded.append(self)
        return self.stream

    def query(self) -> bool:
        self.gpu.queries += 1
        if self.gpu.fail_query:
            raise RuntimeError("operation not permitted on an event last recorded in a capturing stream")
        return self.stream is not None and 0 <= self.index < self.stream.done


@pytest.fixture(params=["native", "python"])
def ring_dir(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ring directory, once with each writer (the C one calls the timer's ``end`` as the Python one does)."""
    probe_writer(request.param, monkeypatch)
    d = tmp_path / "rings"
    monkeypatch.setenv(probe.ENV_DIR, str(d))
    monkeypatch.setenv(probe.ENV_SLOTS, "8")
    monkeypatch.setenv(probe.ENV_RANK, "1")
    monkeypatch.setenv(probe.ENV_GPU, "0")  # enable_gpu() below turns it on with the fake
    # The ring's target table is process-wide and holds 30 names (later ones share the last): this file's
    # targets must not fill it for the test files that run after it in the same process.
    probe.reset()
    probe.writer._TARGET_NAMES.clear()
    yield d
    probe.reset()
    probe.writer._TARGET_NAMES.clear()


@pytest.fixture
def gpu(ring_dir: Path) -> FakeGpu:
    g = FakeGpu()
    timer = probe.enable_gpu(lambda: FakeEvent(g), lambda: g.capturing, start_thread=False, coalesce_us=0,
                             stream_key=lambda: g.current, stream_idle=lambda s: s.idle)
    assert timer is not None
    return g


def _fetch_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent("""
        def fetch_rows(table, ids):
            return [table[i] for i in ids]
    """), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def _read() -> list[ProbeRecord]:
    path = probe.ring_file()
    assert path is not None
    return sorted(probe.read_ring(path, node=0, record=ProbeRecord), key=lambda r: r.seq)


def _poll(now: float) -> int:
    timer = probe.gpu_timer()
    assert timer is not None
    return timer.poll(now)


def test_call_returns_while_its_gpu_work_is_queued_then_in_flight_then_done(gpu: FakeGpu) -> None:
    mod = _fetch_module("gpu_t1")
    probe.install(["gpu_t1:fetch_rows@ids"])
    assert mod.fetch_rows([10, 11, 12], [2, 0]) == [12, 10]
    s0 = gpu.current
    assert len(s0.recorded) == 1, "one event per call, recorded after it"
    assert gpu.queries == 0, "the hot path must never query (or wait on) an event"

    (rec,) = _read()
    assert rec.end is not None and rec.gpu and rec.gpu_start is None and rec.gpu_end is None
    assert not rec.gpu_in_flight(rec.end + 100.0), "not resolved by the reader yet: not in flight"

    t1 = rec.end + 1.0
    assert _poll(t1) == 1
    (rec,) = _read()
    # No earlier probed call on the stream: the work may have started when the host call did.
    assert rec.gpu_start == pytest.approx(rec.start) and rec.gpu_end is None
    assert rec.gpu_in_flight(rec.start + 7.5) and rec.gpu_age(rec.start + 7.5) == pytest.approx(7.5)
    assert not rec.gpu_in_flight(rec.start - 1.0), "not in flight before its host call"

    s0.complete(1)
    assert _poll(t1 + 2.0) == 0
    (rec,) = _read()
    assert rec.gpu_end == t1 + 2.0 and rec.gpu_start == pytest.approx(rec.start)
    assert not rec.gpu_in_flight(t1 + 2.0)


def test_the_generic_wrapper_records_gpu_work_too(gpu: FakeGpu) -> None:
    """A target whose signature the probe cannot mirror (``*args``) gets the generic wrapper: the same event,
    the same ring states as the generated one."""
    mod = types.ModuleType("gpu_t1b")
    exec("def fetch_rows(*args):\n    return list(args[1])\n", mod.__dict__)
    sys.modules["gpu_t1b"] = mod
    probe.install(["gpu_t1b:fetch_rows@1"])
    assert probe.writer._NATIVE is not None or \
        not mod.fetch_rows.__code__.co_filename.startswith("<sgl-seat probe wrapper")
    assert mod.fetch_rows(None, [4, 5]) == [4, 5]
    assert len(gpu.current.recorded) == 1 and gpu.queries == 0
    (rec,) = _read()
    _poll(rec.end + 0.5)
    (rec,) = _read()
    assert rec.gather_size == 2 and rec.gpu and rec.gpu_start == pytest.approx(rec.start)
    assert rec.gpu_in_flight(rec.end + 1.0)


def test_start_is_bounded_by_the_previous_end_seen_on_the_stream(gpu: FakeGpu) -> None:
    """Two calls enqueued back to back: the second's work cannot start before the first's end event completed,
    which the reader saw at its poll; before that the second is queued behind the first, not in flight."""
    mod = _fetch_module("gpu_t2")
    probe.install(["gpu_t2:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    mod.fetch_rows([1], [0])
    first, second = _read()
    t = second.end + 3.0
    _poll(t)
    first, second = _read()
    assert first.gpu_in_flight(t) and first.gpu_start == pytest.approx(first.start)
    assert second.gpu and second.gpu_start is None and not second.gpu_in_flight(t + 10.0)

    gpu.current.complete(1)
    _poll(t + 4.0)  # the first's end seen at t + 4: the second could start then at the earliest
    first, second = _read()
    assert first.gpu_end == t + 4.0
    assert second.gpu_start == t + 4.0 and second.gpu_in_flight(t + 5.0)
    assert second.gpu_age(t + 5.0) == pytest.approx(1.0)


def test_incremental_reader_sees_the_gpu_state_change(gpu: FakeGpu) -> None:
    """The sidecar's RingReader decodes only changed slots: a slot whose GPU work is open must stay watched."""
    mod = _fetch_module("gpu_t3")
    probe.install(["gpu_t3:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    path = probe.ring_file()
    assert path is not None
    reader = probe.RingReader(path, record=ProbeRecord)
    (first,) = reader.read(node=0)
    assert first.gpu and first.gpu_start is None
    assert first.end is not None
    _poll(first.end + 1.0)
    (second,) = reader.read(node=0)
    assert second.seq == first.seq and second.gpu_start == pytest.approx(first.start) and second.gpu_end is None
    gpu.current.complete(1)
    _poll(first.end + 2.0)
    (third,) = reader.read(node=0)
    assert third.gpu_end == first.end + 2.0
    assert reader.read(node=0) == [], "a resolved slot is not decoded again"


def test_stalled_kernel_keeps_later_calls_queued_and_names_the_stalled_one(gpu: FakeGpu) -> None:
    """Three calls; the GPU stalls inside the second: it is in flight, the third is only queued."""
    mod = _fetch_module("gpu_t4")
    probe.install(["gpu_t4:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1, 2], [0, 1])
    gpu.current.complete(1)  # call 1's end; call 2's never comes
    t = _read()[-1].end + 1.0
    assert _poll(t) == 2
    recs = _read()
    assert [r.gpu_end is not None for r in recs] == [True, False, False]
    assert [r.seq for r in recs if r.gpu_in_flight(t + 7.4)] == [recs[1].seq]
    assert recs[1].gpu_age(t + 7.4) == pytest.approx(7.4)
    assert all(r.end is not None for r in recs), "the CPU side of every call returned"
    assert _poll(t + 1.0) == 2 and _read()[1].gpu_start == t, "a later poll keeps the published start"


def test_streams_resolve_independently(gpu: FakeGpu) -> None:
    """A call on a stalled stream stays in flight while calls on another stream complete; the bound for each
    call's start comes from its own stream."""
    mod = _fetch_module("gpu_t4b")
    probe.install(["gpu_t4b:fetch_rows@ids"])
    mod.fetch_rows([1], [0])  # s0: stalls
    gpu.current = gpu.stream("s1")
    mod.fetch_rows([1], [0])
    mod.fetch_rows([1], [0])
    gpu.stream("s1").complete(2)
    t = _read()[-1].end + 1.0
    assert _poll(t) == 1
    a, b, c = _read()
    assert a.gpu_in_flight(t) and a.gpu_start == pytest.approx(a.start)
    assert b.gpu_end == t and c.gpu_end == t


def test_a_long_queue_is_resolved_with_few_queries(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Completed events are a prefix of each stream's queue: the reader finds its end by bisection, so its
    queries (each a runtime call holding the engine's GIL) grow with log2 of the queue, not with the calls."""
    monkeypatch.setenv(probe.ENV_SLOTS, "512")
    probe.reset()
    g = FakeGpu()
    assert probe.enable_gpu(lambda: FakeEvent(g), lambda: False, start_thread=False, coalesce_us=0) is not None
    mod = _fetch_module("gpu_t9")
    probe.install(["gpu_t9:fetch_rows@ids"])
    for _ in range(300):
        mod.fetch_rows([1], [0])
    g.current.complete(137)
    t = time.time() + 1.0
    assert _poll(t) == 300 - 137
    assert g.queries <= 12, f"{g.queries} queries for one stream of 300 calls"
    recs = _read()
    assert [r.gpu_end == t for r in recs] == [True] * 137 + [False] * 163
    assert [r.gpu_in_flight(t) for r in recs].count(True) == 1 and recs[137].gpu_in_flight(t)
    g.queries = 0
    g.current.complete(1000)
    assert _poll(t + 1.0) == 0 and g.queries == 1, "when the newest completed, one query settles them all"


def test_no_event_while_a_graph_is_captured(gpu: FakeGpu) -> None:
    mod = _fetch_module("gpu_t5")
    probe.install(["gpu_t5:fetch_rows@ids"])
    gpu.capturing = True
    mod.fetch_rows([1], [0])
    gpu.capturing = False
    (rec,) = _read()
    assert not rec.gpu and gpu.current.recorded == []
    assert rec.end is not None  # still timed on the host


def test_a_failing_query_drops_the_streams_calls(gpu: FakeGpu) -> None:
    mod = _fetch_module("gpu_t5b")
    probe.install(["gpu_t5b:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    gpu.fail_query = True
    (rec,) = _read()
    assert _poll(rec.end + 1.0) == 0
    (rec,) = _read()
    assert not rec.gpu and not rec.gpu_in_flight(rec.end + 1.0)
    timer = probe.gpu_timer()
    assert timer is not None and timer.errors == 1


def test_a_reused_slot_does_not_take_an_old_calls_gpu_times(gpu: FakeGpu) -> None:
    mod = _fetch_module("gpu_t6")
    probe.install(["gpu_t6:fetch_rows@ids"])
    for _ in range(9):  # 8 slots: the 9th call reuses the first call's slot while call 1's event is unresolved
        mod.fetch_rows([1], [0])
    assert len(gpu.current.recorded) == 8, "at most one unresolved call per slot: the 9th call gets no event"
    gpu.current.complete(8)
    t = time.time() + 1.0
    _poll(t)
    recs = _read()
    assert [r.seq for r in recs] == list(range(2, 10))
    assert all(r.gpu and r.gpu_end == t for r in recs[:-1])
    assert not recs[-1].gpu and recs[-1].gpu_end is None, "call 9 must not get call 1's GPU times"
    assert _poll(t + 1.0) == 0


def test_graph_capture_hooks_count_captures_in_progress() -> None:
    """The hot path's capture test reads a counter kept by wrapping torch's CUDAGraph capture methods."""

    class CUDAGraph:
        def capture_begin(self, pool: object = None) -> None:
            if pool == "bad":
                raise RuntimeError("capture refused")

        def capture_end(self) -> None:
            pass

    cuda = types.SimpleNamespace(graphs=types.SimpleNamespace(CUDAGraph=CUDAGraph),
                                 is_current_stream_capturing=lambda: False)
    fake_torch = types.SimpleNamespace(cuda=cuda)
    test = probe.gpu._graph_capture_hooks(fake_torch)
    assert test is not None and not test()
    assert probe.gpu._graph_capture_hooks(fake_torch) is test, "idempotent: the methods are wrapped once"
    graph = CUDAGraph()
    graph.capture_begin()
    assert test()
    graph.capture_end()
    assert not test()
    with pytest.raises(RuntimeError):
        graph.capture_begin("bad")
    assert not test(), "a capture that failed to begin is not counted"


def test_auto_mode_stays_off_without_cuda(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU-only machine (or before CUDA is initialised) the probe times the host call only."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process: auto mode would turn GPU timing on")
    monkeypatch.setenv(probe.ENV_GPU, "auto")
    probe.reset()
    mod = _fetch_module("gpu_t7")
    probe.install(["gpu_t7:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    assert probe.gpu_timer() is None
    (rec,) = _read()
    assert not rec.gpu


def test_real_cuda_events_time_a_stalled_kernel(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none): the fake-event tests above cover the logic; "
                    "bench/gpu/gpu_watchdog.py runs this on a GPU machine")
    torch.cuda.init()
    monkeypatch.setenv(probe.ENV_GPU, "1")
    probe.reset()
    mod = types.ModuleType("gpu_t8")

    def fetch_rows(table: object, ids: object) -> None:
        torch.cuda._sleep(int(2e8))  # ~0.1-0.2 s of GPU spin inside the call; the call returns at once

    mod.fetch_rows = fetch_rows  # type: ignore[attr-defined]
    sys.modules["gpu_t8"] = mod
    probe.install(["gpu_t8:fetch_rows@"])
    mod.fetch_rows(None, None)
    timer = probe.gpu_timer()
    assert timer is not None
    (rec,) = _read()
    assert rec.end is not None and rec.gpu and rec.gpu_end is None
    timer.poll()
    (rec,) = _read()
    assert rec.gpu_in_flight(time.time()), "the spin kernel is still running"
    torch.cuda.synchronize()
    timer.poll()
    (rec,) = _read()
    assert rec.gpu_start is not None and rec.gpu_end is not None and rec.gpu_end >= rec.gpu_start


def test_real_cuda_calls_close_together_share_one_event(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real GPU, with the default window: three spinning calls back to back record one event (the C writer
    queues the later two itself, through the timer's fast path), and all three resolve once the stream is idle."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none): the fake-event tests above cover the logic; "
                    "bench/gpu/writer_cost.py measures this path on a GPU machine")
    torch.cuda.init()
    monkeypatch.setenv(probe.ENV_GPU, "1")
    monkeypatch.setenv(probe.ENV_GPU_COALESCE, "1000000")  # 1 s: the three calls fall in one window
    probe.reset()
    mod = types.ModuleType("gpu_t9")

    def fetch_rows(table: object, ids: object) -> None:
        torch.cuda._sleep(int(1e8))

    mod.fetch_rows = fetch_rows  # type: ignore[attr-defined]
    sys.modules["gpu_t9"] = mod
    probe.install(["gpu_t9:fetch_rows@"])
    for _ in range(3):
        mod.fetch_rows(None, None)
    timer = probe.gpu_timer()
    assert timer is not None and timer._fast is not None, "the CUDA paths give the C writer its fast path"
    assert timer._fast[3] != 0, "cudaEventRecord's address, checked by a round trip"
    assert timer.recorded == 1 and timer.errors == 0
    torch.cuda.synchronize()
    timer.poll()
    recs = _read()
    assert len(recs) == 3 and all(r.gpu and r.gpu_end is not None for r in recs)


gpu_t10_spin: list[list[int]] = [[]]


def test_real_cuda_events_recorded_by_the_c_writer_resolve(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a real GPU with no window: each spinning call records its own event (under the C writer through
    ``cudaEventRecord``, after the first); of three more, the third stalls its kernel: the first two are done, the
    third in flight, while every call has returned; all resolve after a synchronize."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none): the fake-event tests above cover the logic; "
                    "bench/gpu/writer_cost.py measures this path on a GPU machine")
    torch.cuda.init()
    monkeypatch.setenv(probe.ENV_GPU, "1")
    monkeypatch.setenv(probe.ENV_GPU_COALESCE, "0")
    probe.reset()
    mod = types.ModuleType("gpu_t10")

    gpu_t10_spin[0] = []

    def fetch_rows(table: object, ids: object) -> None:
        spins = gpu_t10_spin[0]
        torch.cuda._sleep(spins.pop(0) if spins else int(2e8))

    mod.fetch_rows = fetch_rows  # type: ignore[attr-defined]
    sys.modules["gpu_t10"] = mod
    probe.install(["gpu_t10:fetch_rows@"])
    for _ in range(3):
        mod.fetch_rows(None, None)
    timer = probe.gpu_timer()
    assert timer is not None and timer.recorded == 3 and timer.errors == 0
    torch.cuda.synchronize()
    timer.poll()
    spins = [int(1e6), int(1e6), int(3e9)]  # the third call's kernel stalls (~1.5-2 s)
    gpu_t10_spin[0] = spins
    for _ in range(3):
        mod.fetch_rows(None, None)
    time.sleep(0.3)
    timer.poll()
    later = _read()[3:]
    now = time.time()
    assert [r.gpu_in_flight(now) for r in later] == [False, False, True], "the C-recorded events name the stall"
    assert later[2].gpu_start is not None and later[0].gpu_end is not None and later[1].gpu_end is not None
    torch.cuda.synchronize()
    timer.poll()
    recs = _read()
    assert len(recs) == 6 and all(r.gpu and r.gpu_end is not None for r in recs)


def test_a_prefilled_pool_keeps_event_creation_off_the_hot_path(gpu: FakeGpu) -> None:
    """Making an event costs 6-12 us on a real GPU host: calls take pooled ones, and the pool refills as the
    reader resolves calls."""
    timer = probe.gpu_timer()
    assert timer is not None
    made = [0]
    factory = timer._factory

    def counting() -> FakeEvent:
        made[0] += 1
        return factory()  # type: ignore[no-any-return]

    timer._factory = counting
    timer.prefill(3)
    assert made[0] == 3
    mod = _fetch_module("gpu_t10")
    probe.install(["gpu_t10:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1], [0])
    assert made[0] == 3, "three calls, three pooled events: none made on the hot path"
    mod.fetch_rows([1], [0])
    assert made[0] == 4, "an empty pool still times the call (one event made)"
    gpu.current.complete(4)
    _poll(time.time() + 1.0)
    for _ in range(4):
        mod.fetch_rows([1], [0])
    assert made[0] == 4, "resolved calls give their events back to the pool"


@pytest.fixture
def coalescing(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeGpu, list[int]]:
    """A timer that lets calls within 1 ms of its stream's last event ride on the next one; a settable clock."""
    g = FakeGpu()
    clock = [10**9]
    monkeypatch.setattr(probe.gpu, "_perf_ns", lambda: clock[0])
    timer = probe.enable_gpu(lambda: FakeEvent(g), lambda: g.capturing, start_thread=False, coalesce_us=1000,
                             stream_key=lambda: g.current, stream_idle=lambda s: s.idle)
    assert timer is not None
    return g, clock


def test_calls_close_together_share_the_next_event(coalescing: tuple[FakeGpu, list[int]]) -> None:
    """Calls 2-3 come within 1 ms of call 1's event: no event of their own; call 4, later, records one that
    covers them (stream order). The GPU stalls inside call 2: call 1 done, call 2 in flight, 3-4 queued."""
    g, clock = coalescing
    mod = _fetch_module("gpu_c1")
    probe.install(["gpu_c1:fetch_rows@ids"])
    for dt in (0, 100_000, 100_000, 2_000_000):  # ns after the previous call
        clock[0] += dt
        mod.fetch_rows([1], [0])
    timer = probe.gpu_timer()
    assert timer is not None and timer.recorded == 2 and len(g.current.recorded) == 2
    g.current.complete(1)
    t = _read()[-1].end + 1.0
    assert _poll(t) == 3
    recs = _read()
    assert recs[0].gpu_end == t
    assert [r.seq for r in recs if r.gpu_in_flight(t + 5.0)] == [recs[1].seq]
    assert recs[1].gpu_start == t and recs[2].gpu_start is None and recs[3].gpu_start is None
    g.current.complete(1)
    assert _poll(t + 1.0) == 0
    assert all(r.gpu_end is not None for r in _read())


def test_trailing_calls_without_an_event_resolve_when_the_stream_is_idle(
        coalescing: tuple[FakeGpu, list[int]]) -> None:
    """The last calls before the host stops calling have no later event: they are in flight until the stream is
    seen idle (all its work done), then done; a stall inside one keeps the stream busy, so it stays in flight."""
    g, _clock = coalescing
    mod = _fetch_module("gpu_c2")
    probe.install(["gpu_c2:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1], [0])
    assert len(g.current.recorded) == 1, "only the first call (nothing queued on its stream) records"
    g.current.complete(1)
    t = _read()[-1].end + 1.0
    assert _poll(t) == 2
    first, second, third = _read()
    assert first.gpu_end == t and second.gpu_in_flight(t + 4.0) and not third.gpu_in_flight(t + 4.0)
    assert _poll(t + 4.0) == 2 and _read()[1].gpu_in_flight(t + 4.0), "a busy stream: still in flight"
    g.current.idle = True
    assert _poll(t + 5.0) == 0
    assert [r.gpu_end for r in _read()] == [t, t + 5.0, t + 5.0]


def test_a_call_after_everything_resolved_records_its_own_event(coalescing: tuple[FakeGpu, list[int]]) -> None:
    """Coalescing needs an unresolved event on the stream; a call that finds none records one, even at once."""
    g, _clock = coalescing
    mod = _fetch_module("gpu_c3")
    probe.install(["gpu_c3:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    g.current.complete(1)
    _poll(_read()[-1].end + 1.0)
    mod.fetch_rows([1], [0])
    assert len(g.current.recorded) == 2


def test_timing_events_give_the_next_calls_start_bound_to_the_microsecond(ring_dir: Path) -> None:
    """With timing events the reader reads when the previous event completed instead of taking its own poll time
    (late by up to a poll period): the next call's start bound, and the order of two ranks' stalled calls."""
    g = FakeGpu()
    assert probe.enable_gpu(lambda: FakeEvent(g), lambda: False, start_thread=False, coalesce_us=0,
                            stream_key=lambda: g.current, event_time=lambda ev: ev.done_at) is not None
    mod = _fetch_module("gpu_t11")
    probe.install(["gpu_t11:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    mod.fetch_rows([1], [0])
    first, second = _read()
    at = second.end + 0.5
    g.current.complete(1, at=at)
    _poll(at + 0.02)  # the poll comes 20 ms after the event completed
    first, second = _read()
    assert first.gpu_end == at + 0.02
    assert second.gpu_start == pytest.approx(at), "the start bound is the event's completion, not the poll"
    assert second.gpu_age(at + 1.0) == pytest.approx(1.0)


def _calls_to_end(timer: probe.GpuTimer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The call numbers that reach the timer's Python ``end`` from now on (the C writer's own paths skip it)."""
    ends: list[int] = []
    real_end = timer.end

    def counting_end(b: int, c: int) -> None:
        ends.append(c)
        real_end(b, c)

    monkeypatch.setattr(timer, "end", counting_end)
    return ends


def test_coalesced_calls_skip_the_timers_python_method_under_the_c_writer(
        ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``timer._fast`` set (as the CUDA paths set it), the C writer queues a call that rides on a later event
    itself; the Python writer goes through ``end``. Both leave the same state: one event for calls close together,
    the later calls waiting on the stream; a capture in progress or a new stream is ``end``'s to decide."""
    g = FakeGpu()
    captures = [0]
    timer = probe.enable_gpu(lambda: FakeEvent(g), lambda: captures[0] > 0, start_thread=False, coalesce_us=60e6,
                             stream_key=lambda: g.current, stream_idle=lambda s: s.idle)
    assert timer is not None
    timer._fast = (captures, lambda _arg: g.current, None, 0, None)  # record_addr 0: recording stays in end()
    ends = _calls_to_end(timer, monkeypatch)
    mod = _fetch_module("gpu_fast1")
    probe.install(["gpu_fast1:fetch_rows@ids"])
    for _ in range(4):
        mod.fetch_rows([1], [0])
    native = probe.writer._native() is not None
    assert ends == ([1] if native else [1, 2, 3, 4]), "only the first call (nothing queued yet) needs end"
    if native:
        assert probe.writer._NATIVE.gpu_pending() == 3, "calls 2-4 wait in the C writer's own buffer"
    timer._drain()  # as the timer does before it reads its state (end(), the reader's poll)
    s = timer._streams[g.streams["s0"]]
    assert len(g.streams["s0"].recorded) == 1 and timer.recorded == 1 and timer._queued == 4
    recs = _read()
    assert [c for _b, c in s.open] == [r.seq for r in recs[1:]], "calls 2-4 wait for the stream's next event"
    captures[0] = 1  # a graph capture in progress: no event, and the call is not queued
    mod.fetch_rows([1], [0])
    assert timer._queued == 4 and _read()[-1].gpu is False
    captures[0] = 0
    g.current = g.stream("s1")  # a new stream: its first call records
    mod.fetch_rows([1], [0])
    assert len(g.streams["s1"].recorded) == 1 and timer._queued == 5
    assert ends == ([1, 5, 6] if native else [1, 2, 3, 4, 5, 6])
    g.streams["s0"].complete(1)
    g.streams["s1"].complete(1)
    g.streams["s0"].idle = True
    t = _read()[-1].end + 1.0
    assert _poll(t) == 0
    assert [r.gpu_end is not None for r in _read()] == [True, True, True, True, False, True]


def test_the_c_writer_records_events_through_the_runtime_address(
        ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``cudaEventRecord``'s address in ``timer._fast`` (here a ctypes callback standing in for it), the C
    writer records a pooled event on the call's stream and opens a new group itself; a record that fails (non-zero
    return), or a thread whose exact stream key is not the fixed one, leaves the call to ``end``. The groups come
    out as the Python method makes them."""
    g = FakeGpu()
    handles: dict[int, FakeEvent] = {}
    by_key = {id(st): st for st in g.streams.values()}

    def make() -> FakeEvent:
        ev = FakeEvent(g)
        ev.cuda_event = id(ev)  # type: ignore[attr-defined]  # torch's Event: the raw handle
        handles[id(ev)] = ev
        return ev

    timer = probe.enable_gpu(make, lambda: False, start_thread=False, coalesce_us=0,
                             stream_key=lambda: id(g.current), record=lambda ev, _key: ev.record(),
                             stream_idle=lambda key: by_key[key].idle)
    assert timer is not None
    timer.prefill(8)
    runtime_calls: list[tuple[int, int]] = []
    fail_next = [False]

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    def fake_record(handle: int, stream: int) -> int:
        if fail_next[0]:
            fail_next[0] = False
            return 1  # cudaErrorInvalidValue
        runtime_calls.append((handle, stream))
        assert stream == id(g.current)
        handles[handle].record()
        return 0

    # As in CUDA: coalesced calls key the stream by a fixed argument (the process's device: here "s0"), a call
    # that records checks the exact key (the thread's current device: here the current stream's name).
    addr = int(ctypes.cast(fake_record, ctypes.c_void_p).value or 0)
    timer._fast = ([0], lambda name: id(g.stream(name)), "s0", addr, lambda: g.current.name)
    ends = _calls_to_end(timer, monkeypatch)
    mod = _fetch_module("gpu_fast2")
    probe.install(["gpu_fast2:fetch_rows@ids"])
    for i in range(4):
        fail_next[0] = i == 2
        mod.fetch_rows([1], [0])
    native = probe.writer._native() is not None
    assert ends == ([1, 3] if native else [1, 2, 3, 4]), "the first call (a new stream) and the failed record go to end"
    assert len(runtime_calls) == (2 if native else 0)
    s = timer._streams[id(g.streams["s0"])]
    assert [[c for _b, c in calls] for _ev, calls in s.groups] == [[1], [2], [3], [4]]
    assert timer.recorded == 4 and timer._queued == 4 and len(g.streams["s0"].recorded) == 4 and not s.open
    g.current = g.stream("s1")  # the thread moves on: the fixed key is no longer its stream's, so end() decides
    mod.fetch_rows([1], [0])
    assert ends[-1] == 5 and len(runtime_calls) == (2 if native else 0)
    s1 = timer._streams[id(g.streams["s1"])]
    assert len(g.streams["s1"].recorded) == 1 and [c for _b, c in s1.groups[0][1]] == [5]
    g.streams["s0"].complete(4)
    g.streams["s1"].complete(1)
    assert _poll(_read()[-1].end + 1.0) == 0
    assert all(r.gpu and r.gpu_end is not None for r in _read())


def test_calls_waiting_in_the_c_writers_buffer_are_published_and_a_resolved_stream_records_again(
        ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls the C writer keeps in its own buffer reach the reader: the poll moves them onto their stream first
    (the first one after the event in flight on the GPU, the next queued); once the stream has nothing
    unresolved, the next call records its own event even inside the window (the reader disarmed it)."""
    g = FakeGpu()
    timer = probe.enable_gpu(lambda: FakeEvent(g), lambda: False, start_thread=False, coalesce_us=60e6,
                             stream_key=lambda: g.current, stream_idle=lambda s: s.idle)
    assert timer is not None
    timer._fast = ([0], lambda _arg: g.current, None, 0, None)
    ends = _calls_to_end(timer, monkeypatch)
    mod = _fetch_module("gpu_fast3")
    probe.install(["gpu_fast3:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1], [0])
    native = probe.writer._native() is not None
    assert ends == ([1] if native else [1, 2, 3])
    g.current.complete(1)
    t = _read()[-1].end + 1.0
    assert _poll(t) == 2
    first, second, third = _read()
    assert first.gpu_end == t and second.gpu_in_flight(t + 4.0) and third.gpu_start is None
    g.current.idle = True
    assert _poll(t + 5.0) == 0 and all(r.gpu_end is not None for r in _read())
    mod.fetch_rows([1], [0])  # inside the window, but nothing is unresolved on the stream: an event of its own
    assert ends[-1] == 4 and len(g.current.recorded) == 2 and timer.recorded == 2
    if native:
        assert probe.writer._NATIVE.gpu_pending() == 0
    timer.stop()  # unregisters it from the C writer; later calls go through end()
    mod.fetch_rows([1], [0])
    assert ends[-1] == 5


def test_only_the_timer_registered_last_takes_the_c_writers_pending_calls(ring_dir: Path) -> None:
    """Two timers in a process (a test, a bench): the C writer serves the one whose ``_fast`` was set last, and an
    older one's drain takes none of the newer one's calls."""
    if probe.writer._native() is None:
        pytest.skip("the C writer's own state: nothing to check with the Python writer")
    g = FakeGpu()
    old = probe.enable_gpu(lambda: FakeEvent(g), lambda: False, start_thread=False, coalesce_us=60e6,
                           stream_key=lambda: g.current, stream_idle=lambda s: s.idle)
    assert old is not None
    old._fast = ([0], lambda _arg: g.current, None, 0, None)
    new = probe.GpuTimer(lambda: FakeEvent(g), lambda: False, gpu_off=old._gpu_word * 8, nslots=old._limit,
                         stream_key=lambda: g.current, coalesce_us=60e6)
    new._fast = ([0], lambda _arg: g.current, None, 0, None)  # the C writer now serves `new`
    probe.writer._GPU = new
    mod = _fetch_module("gpu_fast4")
    probe.install(["gpu_fast4:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1], [0])
    assert probe.writer._NATIVE.gpu_pending() == 2
    old._drain()
    assert old._queued == 0 and probe.writer._NATIVE.gpu_pending() == 2
    new._drain()
    assert new._queued == 3 and [c for _b, c in new._streams[g.current].open] == [r.seq for r in _read()[1:]]
    new.stop()
