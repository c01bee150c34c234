"""The probe on the GPU stream: CUDA events around each wrapped call, resolved off the hot path into the ring.

A fake event object stands in for ``torch.cuda.Event`` (CI has no GPU): a :class:`FakeStream` completes its
recorded events only when the test says so, the way a stalled kernel keeps every later event pending. One
test at the end uses real CUDA events and is skipped, saying why, where torch sees no GPU.
"""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

from sgl_seat.core.records import ProbeRecord
from sgl_seat.watchdog import probe


class FakeStream:
    """Events complete in the order recorded, up to where the test lets the 'GPU' get."""

    def __init__(self) -> None:
        self.recorded: list[FakeEvent] = []
        self.done = 0  # events [0, done) have completed
        self.queries = 0
        self.capturing = False

    def complete(self, n: int, gpu_t: float) -> None:
        """The GPU reaches the next ``n`` recorded events at GPU time ``gpu_t`` (ms on its own clock)."""
        for ev in self.recorded[self.done:self.done + n]:
            ev.gpu_ms = gpu_t
        self.done = min(len(self.recorded), self.done + n)


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream = stream
        self.index = -1
        self.gpu_ms: float | None = None

    def record(self) -> None:
        assert not self.stream.capturing, "an event recorded while the stream is captured breaks the capture"
        self.index = len(self.stream.recorded)
        self.gpu_ms = None
        self.stream.recorded.append(self)

    def query(self) -> bool:
        self.stream.queries += 1
        return 0 <= self.index < self.stream.done

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.gpu_ms is not None and other.gpu_ms is not None, "elapsed_time of an incomplete event"
        return other.gpu_ms - self.gpu_ms


@pytest.fixture
def ring_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "rings"
    monkeypatch.setenv(probe.ENV_DIR, str(d))
    monkeypatch.setenv(probe.ENV_SLOTS, "8")
    monkeypatch.setenv(probe.ENV_RANK, "1")
    monkeypatch.setenv(probe.ENV_GPU, "0")  # enable_gpu() below turns it on with the fake
    probe.reset()
    yield d
    probe.reset()


@pytest.fixture
def stream(ring_dir: Path) -> FakeStream:
    s = FakeStream()
    timer = probe.enable_gpu(lambda: FakeEvent(s), lambda: s.capturing, start_thread=False)
    assert timer is not None
    return s


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
    return probe.read_ring(path, node=0)


def _poll(now: float) -> int:
    timer = probe.gpu_timer()
    assert timer is not None
    return timer.poll(now)


def test_call_returns_while_its_gpu_work_is_queued_then_in_flight_then_done(stream: FakeStream) -> None:
    mod = _fetch_module("gpu_t1")
    probe.install(["gpu_t1:fetch_rows@ids"])
    assert mod.fetch_rows([10, 11, 12], [2, 0]) == [12, 10]
    assert len(stream.recorded) == 2  # start and end event, one pair per call
    assert stream.queries == 0, "the hot path must never query (or wait on) an event"

    (rec,) = _read()
    assert rec.end is not None and rec.gpu and rec.gpu_start is None and rec.gpu_end is None
    assert not rec.gpu_in_flight(rec.end + 100.0), "queued work (start event pending) is not in flight"

    stream.complete(1, gpu_t=0.0)  # the stream reached the fetch's work: start event done
    assert _poll(5000.0) == 1
    (rec,) = _read()
    assert rec.gpu_start == 5000.0 and rec.gpu_end is None
    assert rec.gpu_in_flight(5007.5) and rec.gpu_age(5007.5) == pytest.approx(7.5)
    assert not rec.gpu_in_flight(4999.0), "not in flight before it started"

    stream.complete(1, gpu_t=16.0)  # the end event, 16 ms of GPU time after the start
    assert _poll(5010.0) == 0
    (rec,) = _read()
    assert rec.gpu_end == 5010.0
    assert rec.gpu_start == 5000.0  # the observed start is earlier than end - elapsed (9.994 s later)
    assert not rec.gpu_in_flight(5010.0) and rec.gpu_age(6000.0) == pytest.approx(10.0)


def test_the_generic_wrapper_records_gpu_work_too(stream: FakeStream) -> None:
    """A target whose signature the probe cannot mirror (``*args``) gets the generic wrapper: same events, same
    ring states as the generated one."""
    mod = types.ModuleType("gpu_t1b")
    exec("def fetch_rows(*args):\n    return list(args[1])\n", mod.__dict__)
    sys.modules["gpu_t1b"] = mod
    probe.install(["gpu_t1b:fetch_rows@1"])
    assert not mod.fetch_rows.__code__.co_filename.startswith("<sgl-seat probe wrapper")
    assert mod.fetch_rows(None, [4, 5]) == [4, 5]
    assert len(stream.recorded) == 2 and stream.queries == 0
    stream.complete(1, gpu_t=0.0)
    _poll(70.0)
    (rec,) = _read()
    assert rec.gather_size == 2 and rec.gpu and rec.gpu_start == 70.0 and rec.gpu_in_flight(71.0)


def test_elapsed_time_refines_a_start_seen_late(stream: FakeStream) -> None:
    mod = _fetch_module("gpu_t2")
    probe.install(["gpu_t2:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    stream.complete(2, gpu_t=0.0)
    stream.recorded[1].gpu_ms = 250.0  # both done by the first poll: 250 ms apart on the GPU
    _poll(100.0)
    (rec,) = _read()
    assert rec.gpu_end == 100.0 and rec.gpu_start == pytest.approx(99.75)


def test_incremental_reader_sees_the_gpu_state_change(stream: FakeStream) -> None:
    """The sidecar's RingReader decodes only changed slots: a slot whose GPU work is open must stay watched."""
    mod = _fetch_module("gpu_t3")
    probe.install(["gpu_t3:fetch_rows@ids"])
    mod.fetch_rows([1], [0])
    path = probe.ring_file()
    assert path is not None
    reader = probe.RingReader(path)
    (first,) = reader.read(node=0)
    assert first.gpu and first.gpu_start is None
    stream.complete(1, gpu_t=0.0)
    _poll(50.0)
    (second,) = reader.read(node=0)
    assert second.seq == first.seq and second.gpu_start == 50.0 and second.gpu_end is None
    stream.complete(1, gpu_t=3.0)
    _poll(51.0)
    (third,) = reader.read(node=0)
    assert third.gpu_end == 51.0
    assert reader.read(node=0) == [], "a resolved slot is not decoded again"


def test_stalled_kernel_keeps_later_calls_queued_and_names_the_stalled_one(stream: FakeStream) -> None:
    """Three calls; the GPU stalls inside the second: it is in flight, the third is only queued."""
    mod = _fetch_module("gpu_t4")
    probe.install(["gpu_t4:fetch_rows@ids"])
    for _ in range(3):
        mod.fetch_rows([1, 2], [0, 1])
    stream.complete(3, gpu_t=1.0)  # call 1 start+end, call 2 start; call 2's end never comes
    assert _poll(10.0) == 2
    recs = {r.seq: r for r in _read()}
    assert [recs[s].gpu_end is not None for s in sorted(recs)] == [True, False, False]
    in_flight = [s for s in sorted(recs) if recs[s].gpu_in_flight(17.4)]
    assert in_flight == [sorted(recs)[1]]
    assert recs[sorted(recs)[1]].gpu_age(17.4) == pytest.approx(7.4)
    assert all(r.end is not None for r in recs.values()), "the CPU side of every call returned"


def test_no_event_while_the_stream_is_captured(stream: FakeStream) -> None:
    mod = _fetch_module("gpu_t5")
    probe.install(["gpu_t5:fetch_rows@ids"])
    stream.capturing = True
    mod.fetch_rows([1], [0])
    stream.capturing = False
    (rec,) = _read()
    assert not rec.gpu and stream.recorded == []
    assert rec.end is not None  # still timed on the host


def test_a_reused_slot_does_not_take_an_old_calls_gpu_times(stream: FakeStream) -> None:
    mod = _fetch_module("gpu_t6")
    probe.install(["gpu_t6:fetch_rows@ids"])
    for _ in range(9):  # 8 slots: the 9th call reuses the first call's slot while call 1's pair is pending
        mod.fetch_rows([1], [0])
    assert len(stream.recorded) == 16, "at most one unresolved pair per slot: the 9th call gets no events"
    stream.complete(16, gpu_t=0.0)
    _poll(3.0)
    recs = sorted(_read(), key=lambda r: r.seq)
    assert [r.seq for r in recs] == list(range(2, 10))
    assert all(r.gpu and r.gpu_end == 3.0 for r in recs[:-1])
    assert not recs[-1].gpu and recs[-1].gpu_end is None, "call 9 must not get call 1's GPU times"
    timer = probe.gpu_timer()
    assert timer is not None and timer.poll(4.0) == 0


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
    torch.cuda.synchronize()
    timer.poll()
    (rec,) = _read()
    assert rec.gpu_start is not None and rec.gpu_end is not None and rec.gpu_end >= rec.gpu_start
