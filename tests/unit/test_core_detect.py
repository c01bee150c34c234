"""Detectors on synthetic records: each fires when it should, stays quiet when it should, in priority order,
and gives the same verdict from records that went through JSON (what replay reads)."""

from __future__ import annotations

import random

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.frames import collective_frame
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    LogLine,
    MetricsPoint,
    ProbeRecord,
    StackSample,
    ThreadStack,
    VerdictKind,
)
from sgl_seat.engines import words_for
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.rankview import rank_views, tokens_per_s

TH = WatchdogSpec()
RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}
T0 = 1_000_000.0
SITE = "/venv/lib/python3.11/site-packages"
STD = "/usr/lib/python3.11"

WORDS = words_for("sglang")

LOOP = Frame("Scheduler.event_loop", "/src/sgl_seat/sim/scheduler.py", 120)
MAIN = Frame("main", "/src/sgl_seat/sim/scheduler.py", 300)
ALL_REDUCE = [Frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2801),
              Frame("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
              Frame("Scheduler.step", "/src/sgl_seat/sim/scheduler.py", 210), LOOP, MAIN]
FETCH = [Frame("fetch_rows", "/src/sgl_seat/sim/rowfetch.py", 88),
         Frame("probe_wrapper", "/src/sgl_seat/probe.py", 321),
         Frame("Scheduler.step", "/src/sgl_seat/sim/scheduler.py", 190), LOOP, MAIN]
TARGET = "sgl_seat.sim.rowfetch:fetch_rows"


def title(rank: int) -> str:
    return f"sglang::scheduler_TP{rank}_EP{rank}"


def sample(t: float, rank: int, frames: list[Frame], *, pid: int | None = None, native: bool = False) -> StackSample:
    th = ThreadStack(thread_id=1, name="MainThread", active=True, owns_gil=False, frames=tuple(frames))
    return StackSample(t=t, node=RANK_NODES[rank], pid=pid or 100 + rank, title=title(rank), rank=rank,
                       native=native, threads=(th,))


def busy(t: float, rank: int, step: int) -> StackSample:
    """A healthy rank: somewhere different in its step each sample."""
    caller = Frame("Scheduler.step", "/src/sgl_seat/sim/scheduler.py", 400 + step % 50)
    frames = [FETCH[0], FETCH[1], caller, LOOP, MAIN] if step % 3 == 0 else \
        [ALL_REDUCE[0], ALL_REDUCE[1], caller, LOOP, MAIN] if step % 3 == 1 else \
        [Frame("Scheduler.sample", "/src/sgl_seat/sim/scheduler.py", 230), caller, LOOP, MAIN]
    return sample(t, rank, frames)


def metrics(t: float, gen: float, running: float, used: float | None = None) -> MetricsPoint:
    vals = {"sglang:generation_tokens_total": gen, "sglang:num_running_reqs": running}
    if used is not None:
        vals["sglang:num_used_tokens"] = used
    return MetricsPoint(t=t, node=0, values=vals)


def fetch(rank: int, seq: int, start: float, end: float | None, size: int = 96) -> ProbeRecord:
    return ProbeRecord(node=RANK_NODES[rank], rank=rank, pid=100 + rank, thread=1, seq=seq, target=TARGET,
                       start=start, end=end, gather_size=size)


def procs(dead: set[int] = frozenset()) -> list[EngineProcess]:  # type: ignore[assignment]
    return [EngineProcess(node=RANK_NODES[r], pid=100 + r, title=title(r), rank=r, alive=r not in dead)
            for r in range(4)]


def healthy(until: float) -> dict[str, list]:  # type: ignore[type-arg]
    """60 s of healthy traffic: stacks at 1 Hz, fetches every 30 ms, tokens flowing."""
    samples, probes, pts = [], [], []
    t, step = T0, 0
    while t <= until:
        samples += [busy(t, r, step + r) for r in range(4)]
        pts.append(metrics(t, gen=100.0 * step, running=8, used=1000.0 + 40 * step))
        t += 1.0
        step += 1
    seq = 1
    t = T0
    while t <= until:
        probes += [fetch(r, seq, t, t + 0.002) for r in range(4)]
        seq += 1
        t += 0.03
    return {"samples": samples, "probes": probes, "metrics": pts, "processes": procs()}


def obs(**kw: list) -> Observation:  # type: ignore[type-arg]
    return Observation.of(words=WORDS, rank_nodes=RANK_NODES, **kw)


def stall_records(stall_at: float, now: float) -> dict[str, list]:  # type: ignore[type-arg]
    """Healthy until ``stall_at``; then rank 3 sits in fetch_rows and ranks 0-2 wait in all_reduce."""
    rec = healthy(stall_at - 0.5)
    t = stall_at
    while t <= now:
        rec["samples"] += [sample(t, r, ALL_REDUCE) for r in range(3)] + [sample(t, 3, FETCH)]
        rec["metrics"].append(metrics(t, gen=rec["metrics"][-1].values["sglang:generation_tokens_total"],
                                      running=8, used=rec["metrics"][-1].values["sglang:num_used_tokens"]))
        t += 1.0
    rec["probes"].append(fetch(3, 999_999, stall_at, None, size=384))
    return rec


def test_healthy_traffic_gives_no_verdict() -> None:
    rec = healthy(T0 + 120)
    assert d.detect(obs(**rec), TH, T0 + 120.5) is None


def test_idle_seat_gives_no_verdict() -> None:
    """Stacks unchanged and tokens flat, but nothing runs: an idle scheduler is not a hang."""
    idle = [Frame("Scheduler.recv_requests", "/src/sgl_seat/sim/scheduler.py", 99), LOOP, MAIN]
    samples = [sample(T0 + i, r, idle) for i in range(30) for r in range(4)]
    pts = [metrics(T0 + i, gen=500, running=0, used=0) for i in range(30)]
    assert d.detect(obs(samples=samples, metrics=pts, processes=procs()), TH, T0 + 30) is None


def test_rowfetch_stall_names_rank_node_frame_and_waiters() -> None:
    rec = stall_records(T0 + 60, T0 + 64)
    v = d.detect(obs(**rec), TH, T0 + 63.5)
    assert v is not None
    assert v.kind is VerdictKind.ROWFETCH_STALL
    assert (v.rank, v.node) == (3, 1)
    assert v.frame == "fetch_rows (rowfetch.py:88)"
    assert v.waiting_ranks == (0, 1, 2)
    assert "gather size 384" in v.evidence[0]
    assert v.t == T0 + 63.5


def test_rowfetch_threshold_is_respected() -> None:
    rec = stall_records(T0 + 60, T0 + 64)
    assert d.detect_rowfetch_stall(obs(**rec), TH, T0 + 62.9) is None
    assert d.detect_rowfetch_stall(obs(**rec), TH, T0 + 63.0) is not None


def test_fetch_that_ends_after_now_counts_as_in_flight_then() -> None:
    """Replay evaluates 'now' = the trigger time; a fetch that returned later was still in flight."""
    rec = healthy(T0 + 10)
    rec["probes"].append(fetch(2, 5_000_000, T0 + 5, T0 + 20))
    v = d.detect(obs(**rec), TH, T0 + 9)
    assert v is not None and v.kind is VerdictKind.ROWFETCH_STALL and v.rank == 2
    assert d.detect_rowfetch_stall(obs(**rec), TH, T0 + 21) is None


def test_process_exited_outranks_a_stall() -> None:
    rec = stall_records(T0 + 60, T0 + 64)
    rec["processes"] = procs(dead={3})
    v = d.detect(obs(**rec), TH, T0 + 64)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED
    assert (v.rank, v.node) == (3, 1)
    assert v.frame == "fetch_rows (rowfetch.py:88)"
    assert any("row-fetch stall" in e for e in v.evidence)


def test_process_exited_prefers_a_scheduler() -> None:
    main = EngineProcess(node=1, pid=50, title="python -m sgl_seat.sim.launch_server", rank=None, alive=False)
    ps = [*procs(dead={2}), main]
    v = d.detect(obs(processes=ps), TH, T0)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and v.rank == 2 and v.node == 1


def test_stack_unchanged_names_the_rank_outside_the_collective() -> None:
    """No probe (e.g. the stall is inside a GPU kernel): the stacks alone must name rank 3."""
    rec = stall_records(T0 + 60, T0 + 70)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None]
    v = d.detect(obs(**rec), TH, T0 + 65)
    assert v is not None and v.kind is VerdictKind.STACK_UNCHANGED
    assert (v.rank, v.node, v.frame) == (3, 1, "fetch_rows (rowfetch.py:88)")
    assert v.waiting_ranks == (0, 1, 2)


def test_stack_unchanged_needs_k_samples() -> None:
    rec = stall_records(T0 + 60, T0 + 70)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None]
    rec["metrics"] = [m for m in rec["metrics"] if m.t <= T0 + 63]
    assert d.detect_stack_unchanged(obs(**rec), TH, T0 + 63) is None  # 4 samples < 5


def test_stack_unchanged_is_quiet_while_tokens_flow() -> None:
    """A rank that happens to be sampled at the same line repeatedly is fine if the seat makes progress."""
    rec = healthy(T0 + 30)
    rec["samples"] = [s for s in rec["samples"] if s.rank != 1] + [sample(T0 + i, 1, ALL_REDUCE) for i in range(31)]
    assert d.detect(obs(**rec), TH, T0 + 30) is None


def test_stack_unchanged_without_metrics_uses_probe_activity() -> None:
    rec = stall_records(T0 + 60, T0 + 70)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None]
    no_metrics = {k: v for k, v in rec.items() if k != "metrics"}
    v = d.detect(obs(**no_metrics), TH, T0 + 65)
    assert v is not None and v.kind is VerdictKind.STACK_UNCHANGED and v.rank == 3
    # ... but an idle node without metrics and without probe activity says nothing
    idle = [Frame("Scheduler.recv_requests", "/src/sgl_seat/sim/scheduler.py", 99), LOOP, MAIN]
    samples = [sample(T0 + i, r, idle) for i in range(30) for r in range(4)]
    assert d.detect(obs(samples=samples, processes=procs()), TH, T0 + 30) is None


def test_node_local_view_of_waiters_names_no_rank() -> None:
    """Node 0's sidecar sees only ranks 0-1, both waiting: the culprit is elsewhere."""
    rec = stall_records(T0 + 60, T0 + 70)
    local = {"samples": [s for s in rec["samples"] if s.node == 0], "metrics": rec["metrics"],
             "probes": [p for p in rec["probes"] if p.node == 0]}
    v = d.detect_stack_unchanged(obs(**local), TH, T0 + 66)
    assert v is not None and v.rank is None and v.frame == "all_reduce (distributed_c10d.py:2801)"


def test_engine_watchdog_log_line() -> None:
    line = LogLine(t=T0, node=1, text="[2026-11-29 10:00:00 TP2 EP2] Scheduler watchdog timeout "
                                      "(self.watchdog_timeout=300, self.soft=False)")
    v = d.detect(obs(logs=[line], processes=procs()), TH, T0 + 1)
    assert v is not None and v.kind is VerdictKind.ENGINE_WATCHDOG and (v.rank, v.node) == (2, 1)
    assert d.detect(obs(logs=[line]), TH, T0 - 1) is None  # a line read after "now" does not count


def test_no_progress_and_its_attribution() -> None:
    rec = stall_records(T0 + 60, T0 + 70)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None]
    rec["samples"] = [s for s in rec["samples"] if s.t < T0 + 60]  # no stacks during the hang
    v = d.detect(obs(**rec), TH, T0 + 66)
    assert v is not None and v.kind is VerdictKind.NO_PROGRESS and v.rank is None
    assert "no token progress for 7.0s while 8 requests run" in v.evidence[0]  # flat since the last healthy point
    # with a (young) in-flight fetch on record, it is attributed to that rank
    rec["probes"].append(fetch(3, 10**7, T0 + 64.5, None))
    v = d.detect(obs(**rec), TH, T0 + 66)
    assert v is not None and v.kind is VerdictKind.NO_PROGRESS and (v.rank, v.node) == (3, 1)


def test_no_progress_needs_fresh_metrics_and_running_requests() -> None:
    rec = stall_records(T0 + 60, T0 + 70)
    only = {"metrics": rec["metrics"]}
    assert d.detect_no_progress(obs(**only), TH, T0 + 63) is None  # flat since T0+59: 4 s < 5 s
    assert d.detect_no_progress(obs(**only), TH, T0 + 64) is not None
    assert d.detect_no_progress(obs(**only), TH, T0 + 90) is None  # metrics stale: silent
    drained = [MetricsPoint(t=m.t, node=0, values={**m.values, "sglang:num_running_reqs": 0.0})
               for m in rec["metrics"]]
    assert d.detect_no_progress(obs(metrics=drained), TH, T0 + 66) is None


def test_num_used_tokens_counts_as_progress() -> None:
    """SGLang bumps generation_tokens_total only when a request finishes."""
    pts = [metrics(T0 + i, gen=100, running=4, used=500 + 10 * i) for i in range(20)]
    assert d.detect_no_progress(obs(metrics=pts), TH, T0 + 19) is None


def test_native_samples_do_not_break_the_stack_detector() -> None:
    rec = stall_records(T0 + 60, T0 + 70)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None]
    native = [Frame("clock_nanosleep", "/usr/lib/libc.so.6", 0, "/usr/lib/libc.so.6", True), *FETCH]
    rec["samples"].append(sample(T0 + 64.5, 3, native, native=True))
    v = d.detect(obs(**rec), TH, T0 + 65)
    assert v is not None and v.kind is VerdictKind.STACK_UNCHANGED and v.rank == 3


def test_verdict_is_deterministic_and_survives_json() -> None:
    rec = stall_records(T0 + 60, T0 + 66)
    now = T0 + 64
    live = d.detect(obs(**rec), TH, now)
    shuffled = {k: random.Random(7).sample(v, len(v)) for k, v in rec.items()}
    assert d.detect(obs(**shuffled), TH, now) == live
    types = {"samples": StackSample, "probes": ProbeRecord, "metrics": MetricsPoint, "processes": EngineProcess}
    through_json = {k: [types[k].from_json(r.to_json()) for r in v] for k, v in rec.items()}  # type: ignore[attr-defined]
    replayed = d.detect(obs(**through_json), d.thresholds_from(TH.model_dump()), now)
    assert replayed == live
    assert live is not None and live.to_json()["kind"] == "row-fetch stall"


def test_thresholds_come_from_the_spec() -> None:
    rec = stall_records(T0 + 60, T0 + 66)
    assert d.detect(obs(**rec), WatchdogSpec(rowfetch_inflight_s=10, no_progress_s=30, stack_unchanged_samples=20),
                    T0 + 64) is None


@pytest.mark.parametrize(("name", "file", "waiting"), [
    ("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", True),
    ("synchronize", f"{SITE}/torch/cuda/__init__.py", True),
    ("Work.wait", f"{SITE}/torch/distributed/x.py", True),
    ("Event.wait", f"{STD}/threading.py", False),
    ("fetch_rows", "/src/sgl_seat/sim/rowfetch.py", False),
])
def test_collective_classification(name: str, file: str, waiting: bool) -> None:
    th = ThreadStack(1, "MainThread", True, False, (Frame(name, file, 1), LOOP))
    assert (collective_frame(th) is not None) is waiting


def test_rank_views_and_tokens_per_s() -> None:
    rec = stall_records(T0 + 60, T0 + 66)
    views = {v.rank: v for v in rank_views(obs(**rec), T0 + 64)}
    assert views[3].state == "fetching" and views[3].inflight_age_s == pytest.approx(4.0)
    assert views[0].state == "collective" and views[0].frame == "all_reduce (distributed_c10d.py:2801)"
    assert views[0].fetch_p50_ms == pytest.approx(2.0, rel=0.05)
    rec2 = healthy(T0 + 30)
    assert tokens_per_s(rec2["metrics"], T0 + 30, WORDS) == pytest.approx(100.0)


def test_process_exited_names_the_first_to_die_in_a_cascade() -> None:
    """Rank 2 crashes; a second later its peers die of the broken collective: rank 2 is named."""
    ps = [EngineProcess(node=RANK_NODES[r], pid=100 + r, title=title(r), rank=r, alive=False,
                        gone_t=T0 + (0.0 if r == 2 else 0.9)) for r in range(4)]
    v = d.detect(obs(processes=ps), TH, T0 + 2)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (2, 1)
    # the engine's own crash line wins over what the sidecars' ticks cannot order (rank 3 seen gone in the same
    # poll as rank 2 on node 1, node 0's ranks earlier by another poller's clock), and brings the exit code
    line = LogLine(t=T0 + 1, node=1, text="[2026-11-29 10:00:01] Subprocess sglang::scheduler_TP3_EP3 (pid=103) "
                                          "crashed with exit code -9. Triggering SIGQUIT for cleanup...")
    tied = [EngineProcess(node=RANK_NODES[r], pid=100 + r, title=title(r), rank=r, alive=False,
                          gone_t=T0 + (0.5 if RANK_NODES[r] == 1 else 0.4)) for r in range(4)]
    v = d.detect(obs(processes=tied, logs=[line]), TH, T0 + 2)
    assert v is not None and v.rank == 3 and "(exit code -9)" in v.evidence[0]
    # a process seen gone after "now" had not died yet
    assert d.detect(obs(processes=ps), TH, T0 - 1) is None


def test_engine_process_gone_t_is_optional_in_json() -> None:
    p = EngineProcess(node=1, pid=5, title="t", rank=2, alive=False, gone_t=12.5)
    assert EngineProcess.from_json(p.to_json()) == p
    old = {"node": 1, "pid": 5, "title": "t", "rank": 2, "alive": False, "exit_code": None}
    assert EngineProcess.from_json(old).gone_t is None
    assert "gone_t" not in EngineProcess(node=1, pid=5, title="t", rank=2, alive=True).to_json()


_PEER = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
         "[127.0.0.1]:53679. This is typically caused by a remote worker crashing.")


def _exc_line(t: float, rank: int, msg: str) -> LogLine:
    return LogLine(t=t, node=RANK_NODES[rank], text=f"[2026-11-29 21:14:50 TP{rank} EP{rank}] Scheduler hit an "
                                                    f"exception: {msg}")


def test_process_exited_names_the_rank_with_its_own_error_over_its_victims_and_polling_order() -> None:
    """GIVEN rank 2 fails in its forward (its own error) and its peers fail their collective ("Connection closed
    by peer"), WHEN node 0's sidecar happened to poll first (ranks 0-1 seen gone before 2-3) THEN rank 2 is named:
    the engine's words decide, not which sidecar ticked first."""
    ps = [EngineProcess(node=RANK_NODES[r], pid=100 + r, title=title(r), rank=r, alive=False,
                        gone_t=T0 + (0.0 if RANK_NODES[r] == 0 else 0.4)) for r in range(4)]
    logs = [_exc_line(T0 + 0.1, 1, _PEER), _exc_line(T0 + 0.1, 3, _PEER),
            _exc_line(T0 + 0.3, 2, "RuntimeError: CUDA error: an illegal memory access was encountered")]
    v = d.detect(obs(processes=ps, logs=logs), TH, T0 + 2)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (2, 1), v
    assert any("rank 2's own error: RuntimeError: CUDA error" in e for e in v.evidence), v.evidence
    assert any(e.startswith("ranks 1, 3 failed their collective because a peer died") for e in v.evidence)
    # without the rank's own line, polling order is all there is: rank 0 (seen first), and the report says so
    v = d.detect(obs(processes=ps, logs=logs[:2]), TH, T0 + 2)
    assert v is not None and (v.rank, v.node) == (0, 0), v
    assert any("rank 2 (node 1)" in e and "polling order" in e for e in v.evidence), v.evidence


def test_a_rank_with_its_own_error_is_named_while_it_is_still_exiting() -> None:
    """GIVEN rank 2 logged its own error and SIGQUIT its node, whose cleanup killed rank 3 first WHEN the sidecar
    sees only rank 3 gone THEN rank 2 is named (it is exiting), not its neighbour."""
    ps = [EngineProcess(node=RANK_NODES[r], pid=100 + r, title=title(r), rank=r, alive=r != 3,
                        gone_t=T0 + 0.2 if r == 3 else None) for r in range(4)]
    logs = [_exc_line(T0 + 0.1, 2, "RuntimeError: sim fault: rank 2 failed in its forward")]
    v = d.detect(obs(processes=ps, logs=logs), TH, T0 + 2)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (2, 1), v
    assert "is exiting after its own error" in v.evidence[0]
    assert any("also gone: 103" in e for e in v.evidence), v.evidence
    # no own error line: the one process seen gone is named
    v = d.detect(obs(processes=ps), TH, T0 + 2)
    assert v is not None and v.rank == 3
