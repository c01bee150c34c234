"""Thresholds learned from healthy calls (core/learned.py): what teaches them, what they judge, and that the live
sidecar, a capture's bundle and replay all judge a call by the same figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.learned import LearnedEntry, LearnedThresholds, Learner, row_thresholds, shape_key
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import EngineProcess, ProbeRecord, VerdictKind
from sgl_seat.engines import words_for
from sgl_seat.forensics.format.archive import unpack_bundle
from sgl_seat.forensics.format.bundle import read_bundle
from sgl_seat.forensics.replay.redetect import observation_of, rerun_detectors
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog import capture as cap

TH = WatchdogSpec()
TARGET = "sgl_seat.sim.rowfetch:fetch_rows"
T0 = 1_000_000.0
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

WORDS = words_for("sglang")


def call(seq: int, start: float, dur: float | None, *, pid: int = 100, rank: int = 0, size: int = 4,
         graph_key: int | None = None) -> ProbeRecord:
    return ProbeRecord(node=0, rank=rank, pid=pid, thread=1, seq=seq, target=TARGET, start=start,
                       end=None if dur is None else start + dur, gather_size=size, graph_key=graph_key)


def steady(n: int, *, dur: float = 0.004, every: float = 0.03, pid: int = 100, size: int = 4,
           start: float = T0) -> list[ProbeRecord]:
    """``n`` back-to-back healthy calls of one shape (a decode loop)."""
    return [call(i, start + i * every, dur, pid=pid, size=size) for i in range(n)]


def test_a_shape_is_learned_after_min_samples_healthy_calls_and_never_below_the_floor() -> None:
    lr = Learner(TH)
    lr.observe(steady(TH.learn_min_samples + TH.learn_warmup_calls - 1))
    assert lr.thresholds().entries == {}  # one call short: the fixed threshold holds
    lr.observe([call(10_000, T0 + 300 * 0.03, 0.004)])
    ent = lr.thresholds().entries[shape_key(0, TARGET, 4, None)]
    assert ent.samples == TH.learn_min_samples
    assert ent.quantile_s == pytest.approx(0.004)
    assert ent.threshold_s == TH.learn_floor_s  # 8 x 4 ms is below the 0.3 s floor
    slow = Learner(WatchdogSpec(learn_floor_s=0.01))
    slow.observe(steady(300, dur=0.02))
    assert slow.thresholds().entries[shape_key(0, TARGET, 4, None)].threshold_s == pytest.approx(8 * 0.02)


def test_warm_up_calls_teach_nothing_first_calls_of_a_shape_and_after_idle() -> None:
    lr = Learner(TH)
    lr.observe([call(0, T0, 31.7, size=1024), call(1, T0 + 32, 1.25, size=1024)])  # a new shape's first two
    assert lr.stats()["warmup_calls"] == 2 and lr.stats()["learned_calls"] == 0
    lr.observe(steady(50, start=T0 + 40))
    learned = lr.stats()["learned_calls"]
    # A call after an idle gap longer than learn_idle_gap_s (here a 30 s pause, then a slow first call).
    lr.observe([call(999, T0 + 40 + 50 * 0.03 + 30, 0.5)])
    assert lr.stats()["learned_calls"] == learned and lr.stats()["warmup_calls"] == 5  # 2 + the first steady one x2 + 1


def test_calls_of_a_hang_and_late_calls_teach_nothing() -> None:
    lr = Learner(TH)
    lr.observe(steady(400))
    lr.thresholds()
    before = lr.stats()["learned_calls"]
    lr.observe([call(401, T0 + 12.1, 20.0)])  # the stalled call itself, returned after its release
    lr.observe([call(402, T0 + 12.2, 0.004)], healthy=False)  # while the sidecar is latched on the hang
    assert lr.stats()["learned_calls"] == before and lr.stats()["unhealthy_calls"] == 2


def test_near_misses_count_healthy_calls_past_half_their_threshold() -> None:
    lr = Learner(TH)
    lr.observe(steady(300))
    lr.thresholds()  # 0.3 s from now on
    lr.observe([call(301, T0 + 9.03, 0.2), call(302, T0 + 9.3, 0.1)])
    st = lr.stats()
    assert st["near_misses"] == 1 and st["worst_ratio"] == pytest.approx(0.2 / 0.3, abs=1e-3)


def _learned(dur: float = 0.004) -> LearnedThresholds:
    lr = Learner(TH)
    lr.observe(steady(300, dur=dur))
    return lr.thresholds()


def test_a_late_call_of_a_learned_shape_is_a_stall_at_its_learned_threshold() -> None:
    history = steady(300)
    t = history[-1].end + 0.001  # type: ignore[operator]
    stalled = call(300, t, None)
    obs = Observation.of(words=WORDS, probes=[*history, stalled], learned=_learned())
    assert d.detect(obs, TH, t + 0.29) is None
    v = d.detect(obs, TH, t + 0.31)
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL and v.rank == 0
    assert "threshold 0.3s (learned from 298 healthy calls of its shape: p99 4.00 ms x 8, floor 0.3s)" in v.evidence[0]
    # The same records without the learned thresholds (an older bundle): the fixed 3 s holds.
    fixed = Observation.of(words=WORDS, probes=[*history, stalled])
    assert d.detect(fixed, TH, t + 2.9) is None and d.detect(fixed, TH, t + 3.01) is not None
    # Learning off in the spec: the fixed threshold, learned thresholds or not.
    assert d.detect(obs, WatchdogSpec(learn_enabled=False), t + 2.9) is None


@pytest.mark.parametrize("why", ["after idle", "first of its shape", "unlearned shape"])
def test_a_warm_up_or_unlearned_call_is_judged_by_the_fixed_threshold(why: str) -> None:
    history = steady(300)
    t = history[-1].end + (10.0 if why == "after idle" else 0.001)  # type: ignore[operator]
    stalled = call(300, t, None, size=4 if why == "after idle" else 600)
    learned = _learned()
    if why == "first of its shape":  # a learned shape (gather 512-1023) this process has not called in the window
        learned = LearnedThresholds(entries={**learned.entries, shape_key(0, TARGET, 600, None):
                                             LearnedEntry(0.3, 0.004, 500)})
    obs = Observation.of(words=WORDS, probes=[*history, stalled], learned=learned)
    rows = row_thresholds(obs.probes, learned, TH.rowfetch_inflight_s, t + 1)
    i = len(history)
    assert rows.seconds[i] == TH.rowfetch_inflight_s and not rows.learned[i]
    assert bool(rows.warmup[i]) is (why != "unlearned shape")
    assert d.detect(obs, TH, t + 2.0) is None
    v = d.detect(obs, TH, t + 3.1)
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL
    if why != "unlearned shape":
        assert "threshold 3.0s (fixed: a warm-up call)" in v.evidence[0]


GRAPH = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend:FullCudaGraphBackend.replay"


def replays(n: int, key: int, *, start: float, pid: int = 100, seq0: int = 0, dur: float = 0.0003) -> list[ProbeRecord]:
    """``n`` healthy decode replays of graph shape ``key`` (12 draft tokens per request), 20 ms apart."""
    return [ProbeRecord(node=0, rank=0, pid=pid, thread=1, seq=seq0 + i, target=GRAPH, start=start + i * 0.02,
                        end=start + i * 0.02 + dur, gather_size=12 * key, graph_key=key) for i in range(n)]


def test_an_unlearned_shape_borrows_the_nearest_larger_learned_shapes_threshold() -> None:
    """The H100 run's first stall: graph 14 had too few healthy replays while graph 16 had thousands; judged by the
    fixed 3 s it took 3.3 s to a bundle. A larger replay of the same graph does the smaller's work and more, so graph
    14 borrows graph 16's learned threshold (not graph 12's: smaller is no bound); a shape larger than every learned
    one keeps the fixed threshold. The sidecar's fast check (Learner.threshold_for) and the detectors agree."""
    lr = Learner(TH)
    history = replays(300, 16, start=T0) + replays(300, 20, start=T0 + 6.5, seq0=300) \
        + replays(30, 14, start=T0 + 13, seq0=600) + replays(300, 12, start=T0 + 14, seq0=700)
    lr.observe(history)
    learned = lr.thresholds()
    assert set(learned.entries) == {shape_key(0, GRAPH, 12 * k, k) for k in (12, 16, 20)}
    learned = LearnedThresholds(entries={**learned.entries, shape_key(0, GRAPH, 12 * 16, 16): LearnedEntry(
        0.45, 0.05, 300)})  # graph 16's own figure apart from graph 20's, to see which one is lent
    t = history[-1].end + 0.001  # type: ignore[operator]
    for key, want, lent in ((14, 0.45, "graph 16"), (15, 0.45, "graph 16"), (16, 0.45, None), (24, 3.0, None)):
        stalled = ProbeRecord(node=0, rank=0, pid=100, thread=1, seq=5000, target=GRAPH, start=t, end=None,
                              gather_size=12 * key, graph_key=key)
        pc = Observation.of(words=WORDS, probes=[*history, *replays(3, key, start=t - 0.2, seq0=4000), stalled]).probes
        rows = row_thresholds(pc, learned, TH.rowfetch_inflight_s, t + 0.1)
        i = len(pc) - 1
        assert float(rows.seconds[i]) == pytest.approx(want), key
        assert (rows.borrowed.get(i, "").rsplit("|", 1)[-1] or None) == lent, key
        fast = Learner(TH)
        fast._current = learned  # the sidecar's learner after this learning
        fast.observe([*history, *replays(3, key, start=t - 0.2, seq0=4000)])
        assert fast.threshold_for(stalled) == pytest.approx(want), key
    stalled = ProbeRecord(node=0, rank=0, pid=100, thread=1, seq=5000, target=GRAPH, start=t, end=None,
                          gather_size=12 * 14, graph_key=14)
    obs = Observation.of(words=WORDS, probes=[*history, *replays(3, 14, start=t - 0.2, seq0=4000), stalled],
                         learned=learned)
    assert d.detect(obs, TH, t + 0.44) is None
    v = d.detect(obs, TH, t + 0.46)
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL
    assert "threshold 0.45s (learned from 300 healthy calls of the nearest larger learned shape, graph 16 " \
           "(its own has too few)" in v.evidence[0], v.evidence


def test_a_gather_bucket_borrows_from_a_higher_bucket_not_from_a_lower_one() -> None:
    learned = LearnedThresholds(entries={shape_key(0, TARGET, 4, None): LearnedEntry(0.5, 0.01, 300),
                                         shape_key(0, TARGET, 64, None): LearnedEntry(0.9, 0.02, 300),
                                         shape_key(0, TARGET, 16, None): LearnedEntry(0.7, 0.02, 50),  # too few
                                         shape_key(1, TARGET, 32, None): LearnedEntry(0.1, 0.01, 300)})  # node 1
    assert learned.entry_for(0, TARGET, 2, None) == (shape_key(0, TARGET, 4, None), LearnedEntry(0.5, 0.01, 300))
    assert learned.entry_for(0, TARGET, 20, None) == (shape_key(0, TARGET, 64, None), LearnedEntry(0.9, 0.02, 300))
    assert learned.entry_for(0, TARGET, 200, None) is None  # larger than every learned bucket
    assert learned.entry_for(0, TARGET, -1, None) is None  # an unknown size has no bound
    assert learned.entry_for(0, TARGET + "x", 2, None) is None  # another target's shapes lend nothing
    assert learned.entry_for(0, TARGET, 4, 3) is None  # a graph replay borrows from graph shapes only


def test_a_stop_is_named_from_the_20hz_proc_reads_at_stopped_s() -> None:
    p = EngineProcess(node=1, pid=101, title="sglang::scheduler_TP1", rank=1, alive=True, stopped_since=T0,
                      state_t=T0 + 0.3)
    obs = Observation.of(words=WORDS, processes=[p], rank_nodes={0: 0, 1: 1})
    assert d.detect(obs, TH, T0 + 0.2) is None
    v = d.detect(obs, TH, T0 + 0.3)
    assert v is not None and v.kind is VerdictKind.PROCESS_STOPPED and (v.rank, v.node) == (1, 1)
    assert "threshold 0.25s" in v.evidence[0] and "/proc read" in v.evidence[0]
    # Read long ago and not since (the sidecar lost it): nothing said.
    assert d.detect(obs, TH, T0 + 60) is None
    # Round trip through JSON (the bundle's processes.jsonl) keeps both times.
    assert EngineProcess.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_learned_thresholds_round_trip_and_refuse_malformed_input() -> None:
    lt = _learned()
    assert LearnedThresholds.from_json(json.loads(json.dumps(lt.to_json()))) == lt
    for bad in ([], {"shapes": []}, {"shapes": {"x": {"threshold_s": -1, "quantile_s": 0, "samples": 1}}},
                {"shapes": {"x": {"threshold_s": 1, "quantile_s": 0, "samples": "9"}}}, {"min_samples": 0}):
        with pytest.raises(ValueError):
            LearnedThresholds.from_json(bad)


def _part(node: int, probes: list[ProbeRecord], learned: LearnedThresholds | None) -> dict:  # type: ignore[type-arg]
    return {"node": node, "t": T0, "samples": [], "native": [], "probes": [p.to_json() for p in probes],
            "metrics": [], "logs": [], "processes": [], "process_state": {}, "env": {}, "capture": [],
            "learned": None if learned is None else learned.to_json()}


def test_the_bundle_carries_the_learned_thresholds_and_replay_judges_by_them(tmp_path: Path) -> None:
    history = steady(300)
    t = history[-1].end + 0.001  # type: ignore[operator]
    recs = [*history, call(300, t, None)]
    res = cap.assemble(words=WORDS, seat="s", parts=[_part(0, recs, _learned())], trigger={"t": t + 0.35},
                       trigger_verdict=None, thresholds=TH, rank_nodes={0: 0}, plan=None, dest_root=tmp_path,
                       quota_mb=100, now=t + 0.35)
    assert res.error is None and res.verdict is not None and res.verdict.kind is VerdictKind.ROWFETCH_STALL
    b = read_bundle(Path(res.path))  # type: ignore[arg-type]
    assert b.manifest.extra["learned"]["shapes"][shape_key(0, TARGET, 4, None)]["threshold_s"] == 0.3
    again, why = rerun_detectors(b)
    assert why is None and again == res.verdict
    assert observation_of(b).learned == _learned()
    # Without its learned thresholds the same bundle's records are no stall at that time (3 s fixed).
    doc = json.loads((Path(res.path) / "manifest.json").read_text())  # type: ignore[arg-type]
    del doc["learned"]
    (Path(res.path) / "manifest.json").write_text(json.dumps(doc))  # type: ignore[arg-type]
    assert rerun_detectors(read_bundle(Path(res.path)))[0] is None  # type: ignore[arg-type]


def _completed(probes: object) -> list[ProbeRecord]:
    return [r for r in probes if r.end is not None]  # type: ignore[attr-defined]


def test_the_sim_and_the_gpu_records_are_learned_by_one_code(tmp_path: Path) -> None:
    """The sim's probe (gather sizes) and the GPU probe (CUDA graph replays keyed by shape) feed the same Learner
    and are judged by the same row_thresholds: one real GPU bundle and one sim bundle (SYNTHETIC figures)."""
    gpu = read_bundle(unpack_bundle(FIXTURES / "gpu" / "sglang-0.5.17-h200" / "bundle-eagle-graph-stall.tar.zst",
                                    tmp_path / "gpu"))
    sim = read_bundle(shutil.copytree(FIXTURES / "bundles" / "stall", tmp_path / "sim"))
    for b, graphs in ((gpu, True), (sim, False)):
        lr = Learner(WatchdogSpec(learn_min_samples=10))
        lr.observe(_completed(b.probes))
        lt = lr.thresholds()
        assert lt.entries, b.path
        assert any("|graph " in k for k in lt.entries) is graphs or not graphs
        for k, e in lt.entries.items():
            assert e.threshold_s == max(0.3, 8 * e.quantile_s), k
        rows = row_thresholds(b.probes, lt, 3.0, b.manifest.trigger_t)
        assert len(rows.seconds) == len(b.probes)


def test_native_stacks_follow_the_written_bundle_and_a_reader_never_sees_half(tmp_path: Path) -> None:
    """The sub-second capture writes the bundle with every process's Python stack, then adds the native stacks and
    nvidia-smi (add_native): the bundle verifies before and after, the late steps and their time are recorded,
    and a read that meets the amendment half done reads again instead of calling the bundle damaged."""
    import threading

    from sgl_seat.core.records import Frame, StackSample, ThreadStack
    from sgl_seat.forensics.format.bundle import amending_marker, verify_bundle

    th = ThreadStack(thread_id=1, name="MainThread", active=True, owns_gil=False,
                     frames=(Frame("event_loop", "/x/scheduler.py", 10),))
    py = StackSample(t=T0, node=0, pid=100, title="sglang::scheduler_TP0", rank=0, native=False, threads=(th,))
    part = _part(0, steady(10), None) | {"samples": [py.to_json()], "native": [py.to_json()]}
    res = cap.assemble(words=WORDS, seat="s", parts=[part], trigger={"t": T0}, trigger_verdict=None, thresholds=TH,
                       rank_nodes={0: 0}, plan=None, dest_root=tmp_path, quota_mb=100, now=T0 + 1)
    path = Path(res.path)  # type: ignore[arg-type]
    assert [s.native for s in read_bundle(path).native_stacks] == [False]
    nat = StackSample(t=T0 + 1, node=0, pid=100, title="sglang::scheduler_TP0", rank=0, native=True,
                      threads=(ThreadStack(thread_id=1, name="MainThread", active=True, owns_gil=False,
                                           frames=(Frame("pthread_cond_wait", "libc.so.6", 0, native=True),)),))
    late = {"node": 0, "native": [nat.to_json()], "gpu": "nvidia-smi text",
            "capture": [{"node": 0, "step": "py-spy --native 100", "status": "ok", "detail": "0.30s after the bundle"}]}
    stop = threading.Event()
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                verify_bundle(path)
            except Exception as exc:
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert cap.add_native(path, [late], written_at=T0 + 1) is None
    finally:
        stop.set()
        t.join(10)
    assert errors == []
    b = read_bundle(path)
    assert [s.native for s in b.native_stacks] == [True] and b.gpu == {0: "nvidia-smi text"}
    assert b.manifest.extra["late"]["native_stacks"] == 1
    assert any(c["step"] == "py-spy --native 100" for c in b.manifest.capture)
    assert not amending_marker(path).exists()
    # A late part is never a way to write any other file into a bundle.
    from sgl_seat.errors import BundleError
    from sgl_seat.forensics.format.annotate import add_late_files

    with pytest.raises(BundleError):
        add_late_files(path, {"probe.jsonl": b""}, [], {})


def test_a_nodes_part_scrubs_its_logs_and_the_bundle_keeps_no_secret(tmp_path: Path) -> None:
    """The logs are scrubbed by each node beside its stack dumps (not again at the coordinator): what reaches the
    bundle, from a part in this process or over the wire, holds no secret."""
    from sgl_seat.core.records import LogLine

    lines = [LogLine(t=T0, node=0, text="export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123"),
             LogLine(t=T0 + 1, node=0, text="[TP0] Decode batch, #running-req: 7, #token: 900")]
    part = cap.node_part(node=0, procs=[], pyspy=None, samples=[], probes=steady(5), metrics=[], logs=lines,
                         processes=[], log_text="password=hunter22 next\nplain line\n", env={}, gpu=False)
    assert part["scrubbed"] is True and "hunter22" not in part["log_text"] and "plain line" in part["log_text"]
    for p in (part, json.loads(json.dumps(cap.wire(part)))):
        res = cap.assemble(words=WORDS, seat="s", parts=[p], trigger={"t": T0}, trigger_verdict=None, thresholds=TH,
                           rank_nodes={0: 0}, plan=None, dest_root=tmp_path / str(id(p)), quota_mb=100, now=T0 + 2)
        assert res.error is None
        text = b"".join(f.read_bytes() for f in Path(res.path).rglob("*") if f.is_file())  # type: ignore[arg-type]
        assert b"hf_abcdefghij" not in text and b"hunter22" not in text and b"#token: 900" in text
