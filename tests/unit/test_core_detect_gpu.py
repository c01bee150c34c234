"""Detectors with GPU records: a kernel-side stall while every rank's stack is the same device sync.

The shape measured on two H200s (../shared/reference/gpu-observations.md): rank 1's fetch kernel stalls, its
CPU thread runs on into the all-reduce and ``synchronize`` like rank 0, so both stacks are identical; only
the CUDA events around the fetch (the probe's GPU record) say rank 1's work is in flight.
"""

from __future__ import annotations

import io

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.detect import noprogress
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import Frame, MetricsPoint, ProbeRecord, StackSample, ThreadStack, VerdictKind
from sgl_seat.engines import words_for
from sgl_seat.forensics.format.codec import decode_probe_records, encode_probe_records
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.rankview import rank_views

TH = WatchdogSpec()
RANK_NODES = {0: 0, 1: 1}
T0 = 2_000_000.0
TARGET = "sgl_seat.sim.rowfetch:fetch_rows"
SITE = "/venv/lib/python3.12/site-packages"
SYNC = [Frame("cuCtxSynchronize_v2", "libcuda.so.580.159.04", native=True),
        Frame("synchronize", f"{SITE}/torch/cuda/__init__.py", 1162),
        Frame("Scheduler._step", "/src/sgl_seat/sim/scheduler.py", 300),
        Frame("Scheduler._loop", "/src/sgl_seat/sim/scheduler.py", 250)]
STALL_AT = T0 + 30.0

WORDS = words_for("sglang")


def sample(t: float, rank: int) -> StackSample:
    th = ThreadStack(thread_id=1, name="MainThread", active=True, owns_gil=False, frames=tuple(SYNC))
    return StackSample(t=t, node=RANK_NODES[rank], pid=100 + rank, title=f"sglang::scheduler_TP{rank}_EP{rank}",
                       rank=rank, native=False, threads=(th,))


def fetch(rank: int, seq: int, start: float, *, gpu_start: float | None, gpu_end: float | None,
          gpu: bool = True) -> ProbeRecord:
    return ProbeRecord(node=RANK_NODES[rank], rank=rank, pid=100 + rank, thread=1, seq=seq, target=TARGET,
                       start=start, end=start + 0.0001, gather_size=64, gpu=gpu, gpu_start=gpu_start,
                       gpu_end=gpu_end)


def records(now: float, *, culprit_gpu_end: float | None, gpu: bool = True) -> dict[str, list]:  # type: ignore[type-arg]
    """Healthy steps every 50 ms until the stall, then both ranks sit in synchronize (same stack)."""
    probes, samples, pts = [], [], []
    seq, t = 1, T0
    while t < STALL_AT:
        for r in (0, 1):
            probes.append(fetch(r, seq, t, gpu_start=t + 0.001 if gpu else None,
                                gpu_end=t + 0.017 if gpu else None, gpu=gpu))
        seq, t = seq + 1, t + 0.05
    # The step-N fetch: rank 0's done in 16 ms, rank 1's kernel started and never finished (or did, late).
    probes.append(fetch(0, seq, STALL_AT, gpu_start=STALL_AT + 0.001 if gpu else None,
                        gpu_end=STALL_AT + 0.017 if gpu else None, gpu=gpu))
    probes.append(fetch(1, seq, STALL_AT, gpu_start=STALL_AT + 0.001 if gpu else None,
                        gpu_end=culprit_gpu_end if gpu else None, gpu=gpu))
    t = STALL_AT + 0.5
    while t <= now:
        samples += [sample(t, 0), sample(t, 1)]
        t += 1.0
    for i in range(int(now - T0) + 1):
        tt = T0 + i
        gen = 100.0 * min(tt, STALL_AT) - 100.0 * T0
        pts.append(MetricsPoint(t=tt, node=0, values={"sglang:num_running_reqs": 8.0,
                                                       "sglang:generation_tokens_total": gen,
                                                       "sglang:num_used_tokens": 1000.0 + gen}))
    return {"samples": samples, "probes": probes, "metrics": pts}


def obs(rec: dict[str, list]) -> Observation:  # type: ignore[type-arg]
    return Observation.of(words=WORDS, rank_nodes=RANK_NODES, **rec)


def test_gpu_in_flight_fetch_names_its_rank_although_stacks_match() -> None:
    now = STALL_AT + 7.4
    v = d.detect(obs(records(now, culprit_gpu_end=None)), TH, now)
    assert v is not None and v.kind == VerdictKind.ROWFETCH_STALL
    assert (v.rank, v.node) == (1, 1)
    assert v.frame is not None and "fetch_rows" in v.frame and "GPU record" in v.frame
    assert "on the GPU" in v.evidence[0] and "7.4s" in v.evidence[0]
    assert v.waiting_ranks == (0,)


def test_gpu_fetch_below_threshold_is_not_yet_a_stall() -> None:
    now = STALL_AT + TH.rowfetch_inflight_s - 0.5
    assert d.detect_rowfetch_stall(obs(records(now, culprit_gpu_end=None)), TH, now) is None


def test_gpu_fetch_that_finished_before_now_is_not_in_flight() -> None:
    now = STALL_AT + 12.0
    rec = records(now, culprit_gpu_end=STALL_AT + 2.0)
    assert d.detect_rowfetch_stall(obs(rec), TH, now) is None


def test_queued_gpu_work_is_not_named() -> None:
    """A fetch whose start event never completed sits behind earlier work on the stream (say, a peer's
    collective): it is not the stalled one, however old."""
    now = STALL_AT + 20.0
    rec = records(now, culprit_gpu_end=STALL_AT + 0.02)
    rec["probes"].append(fetch(0, 10**6, STALL_AT + 0.03, gpu_start=None, gpu_end=None))
    assert d.detect_rowfetch_stall(obs(rec), TH, now) is None


def test_identical_waits_are_undecided_when_gpu_records_exist() -> None:
    """Every rank in a device sync, stacks unchanged, GPU records present but none in flight: no verdict from
    stacks (the culprit's CPU thread waits there too); without GPU records the old verdict stands."""
    now = STALL_AT + 12.0
    with_gpu = obs(records(now, culprit_gpu_end=STALL_AT + 0.02))
    assert d.detect_stack_unchanged(with_gpu, TH, now) is None
    without = obs(records(now, culprit_gpu_end=None, gpu=False))
    v = d.detect_stack_unchanged(without, TH, now)
    assert v is not None and v.kind == VerdictKind.STACK_UNCHANGED and v.rank is None


def test_no_progress_attributes_a_gpu_in_flight_fetch() -> None:
    now = STALL_AT + 12.0
    rank, node, frame, why = noprogress._attribute(obs(records(now, culprit_gpu_end=None)), now)
    assert (rank, node) == (1, 1) and frame is not None and "fetch_rows" in frame
    assert why is not None and "on the GPU" in why


@pytest.mark.parametrize("end", [None, STALL_AT + 3.0])
def test_gpu_fields_survive_json_and_the_bundle_codec(end: float | None) -> None:
    recs = [fetch(1, 7, STALL_AT, gpu_start=STALL_AT + 0.001, gpu_end=end),
            ProbeRecord(0, 0, 100, 1, 8, TARGET, STALL_AT, STALL_AT + 0.1, 64)]
    for r in recs:
        assert ProbeRecord.from_json(r.to_json()) == r
    table = decode_probe_records(io.BytesIO(encode_probe_records(recs)), "probes.jsonl")
    assert sorted(table, key=lambda r: r.seq) == recs
    stall = d.detect_rowfetch_stall(Observation.of(words=WORDS, probes=table), TH, STALL_AT + 9.0)
    assert (stall is not None) == (end is None)


def test_records_without_gpu_fields_read_as_before() -> None:
    """Schema-1 readers: a record written before the GPU fields existed parses with gpu off."""
    old = {"node": 0, "rank": 1, "pid": 5, "thread": 1, "seq": 3, "target": TARGET, "start": 1.0, "end": None,
           "gather_size": 4}
    r = ProbeRecord.from_json(old)
    assert not r.gpu and r.gpu_start is None and r.to_json() == old


def test_watch_rank_view_shows_the_gpu_in_flight_fetch() -> None:
    now = STALL_AT + 7.4
    views = {v.rank: v for v in rank_views(obs(records(now, culprit_gpu_end=None)), now)}
    assert views[1].state == "gpu fetch" and views[1].inflight_on_gpu
    assert views[1].inflight_age_s == pytest.approx(7.399, abs=0.01)
    assert views[0].state == "collective" and not views[0].inflight_on_gpu and views[0].inflight_age_s is None
    assert views[1].to_json()["inflight_on_gpu"] is True


def test_inflight_age_counts_the_call_then_its_gpu_work_never_queued_work() -> None:
    cpu = ProbeRecord(0, 0, 1, 1, 1, TARGET, 10.0, None, 4)
    assert cpu.inflight_age(12.5) == pytest.approx(2.5)
    on_gpu = fetch(1, 2, 10.0, gpu_start=11.0, gpu_end=None)
    assert on_gpu.inflight_age(14.0) == pytest.approx(3.0)
    queued = fetch(1, 3, 10.0, gpu_start=None, gpu_end=None)
    assert queued.inflight_age(100.0) is None
    done = fetch(1, 4, 10.0, gpu_start=10.1, gpu_end=10.2)
    assert done.inflight_age(11.0) is None and done.inflight_age(10.15) == pytest.approx(0.05)
