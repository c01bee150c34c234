"""The probe around CUDA graph replay (issue 25): the wrapper, the in-flight rule and the report, on fakes.

SGLang decodes, and verifies the draft, by replaying CUDA graphs; the Engram host-table read is a kernel inside the
graph, with no Python of its own. The probe wraps the replay entry (``FullCudaGraphBackend.replay(self, shape_key,
static_forward_batch)``) and records CUDA events before and after each replay on the replay stream. CI has no GPU,
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

from sgl_seat.core import detect as d
from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import MetricsPoint, ProbeRecord, VerdictKind
from sgl_seat.forensics.analysis import rowfetch_buckets
from sgl_seat.forensics.codec import decode_probe_records, encode_probe_records
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog import probe
from sgl_seat.watchdog.probe import graph, ring
from tests.unit.test_watchdog_probe_gpu import FakeEvent, FakeGpu


@dataclass(frozen=True)
class ShapeKey:
    """SGLang's ShapeKey (runner/shape_key.py): ``size`` counts requests for decode."""

    size: int


@pytest.fixture
def ring_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
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
                return "out"
    """), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def _records() -> list[ProbeRecord]:
    path = probe.ring_file()
    assert path is not None
    return sorted(probe.read_ring(path, node=0), key=lambda r: r.seq)


def _install(name: str, width: int = 4, ragged: bool = False) -> tuple[types.ModuleType, FakeGpu]:
    mod = _backend_module(name, width=width, ragged=ragged)
    state = probe.install([f"{name}:Backend.replay@shape_key:graph"])
    assert state[f"{name}:Backend.replay@shape_key:graph"] == "installed"
    g = FakeGpu()
    timer = graph.enable_graph(lambda: FakeEvent(g), lambda: g.capturing, start_thread=False,
                               stream_key=lambda: g.current)
    assert timer is not None
    return mod, g


def test_a_replay_is_one_record_with_its_token_count_shape_key_and_two_events(ring_dir: Path) -> None:
    """GIVEN a verify graph captured for 8 requests x 4 draft tokens WHEN it replays THEN one ring record says it
    was a graph replay of shape key 8 with 32 tokens, and two events went on the replay stream around it."""
    mod, g = _install("fake_backend_a", width=4)
    backend = mod.Backend()
    assert backend.replay(ShapeKey(8), None) == "out" and backend.replays == 1
    assert len(g.current.recorded) == 2, "an event before and one after the replay"
    (rec,) = _records()
    assert rec.graph_replay and rec.graph_key == 8 and rec.gather_size == 32
    assert rec.target == "fake_backend_a:Backend.replay"
    assert rec.end is not None and rec.gpu and rec.gpu_start is None, "queued: its start event has not completed"


def test_the_reader_marks_a_replay_started_then_done_from_its_events(ring_dir: Path) -> None:
    """GIVEN a replayed graph WHEN only its start event completes THEN it is in flight on the GPU (a stalled kernel
    inside the graph); WHEN its end event completes too THEN it is done."""
    mod, g = _install("fake_backend_b", width=1)
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


def test_a_later_replay_waits_queued_behind_a_stalled_one(ring_dir: Path) -> None:
    """GIVEN two replays on one stream WHEN the first's end never comes THEN the second is queued, not in flight
    (its work waits behind the stall), so only the stalled replay ages."""
    mod, g = _install("fake_backend_c", width=2)
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


def test_no_event_is_recorded_while_a_graph_is_captured(ring_dir: Path) -> None:
    """GIVEN a graph being captured WHEN the replay entry runs THEN no event is recorded (it would belong to the
    captured graph: FakeEvent.record asserts it) and the call is recorded with host timing only."""
    mod, g = _install("fake_backend_d", width=1)
    g.capturing = True
    mod.Backend().replay(ShapeKey(2), None)
    assert g.current.recorded == []
    (rec,) = _records()
    assert rec.graph_key == 2 and not rec.gpu


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
    return Observation.of(rank_nodes={0: 0, 1: 1}, probes=probes, samples=[], metrics=pts)


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
    assert [(b["gather_size_min"], b["count"]) for b in rf["buckets"]] == [(4, 10)]
    assert rf["graph_replays"] == 21 and rf["graph_in_flight"] == 1
    g = {b["gather_size_min"]: b for b in rf["graph_buckets"]}
    assert g[32]["shape_keys"] == [8] and g[32]["count"] == 10 and g[32]["in_flight"] == 0
    assert g[64]["shape_keys"] == [16] and g[64]["count"] == 11 and g[64]["stalled"]
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
    assert np.isclose(rf["buckets"][0]["count"], 5)


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
