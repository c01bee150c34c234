"""The pre-hang warning (sgl_seat.core.warning): a row-fetch tail growing at the largest gather buckets, live
(records or columns) and in a replayed bundle's history.

Synthetic probe records (every latency here is made up): a steady seat whose fetches take a few ms at every
gather size, then one rank whose fetches at its largest gather slow down. The warning must name that rank and
bucket, and stay quiet for what is not a trend: a larger gather being slower, one outlier, microsecond jitter, a
slowdown at a small gather, records after ``now``.
"""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import pytest
from rich.console import Console

from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.records import ProbeRecord, RecordError, Verdict, VerdictKind
from sgl_seat.core.warning import (
    PREHANG_KIND,
    PreHangWarning,
    TailReading,
    WarningRule,
    detect_prehang,
    first_warning,
    tail_readings,
)
from sgl_seat.forensics import write_bundle
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.codec import encode_probe_records
from sgl_seat.forensics.replay.bundle_text import render_report
from sgl_seat.forensics.replay.replayer import replay_bundle

GATHERS = (8, 100, 700)  # buckets 8-15, 64-127, 512-1023


class Seat:
    """Records of a synthetic seat: each rank fetches every ``period`` s, cycling through GATHERS."""

    def __init__(self, ranks: int = 4, seed: int = 0) -> None:
        self.ranks = ranks
        self.rng = random.Random(seed)
        self.recs: list[ProbeRecord] = []
        self.seq = 0

    def add(self, rank: int, start: float, dur: float | None, gather: int) -> None:
        self.seq += 1
        self.recs.append(ProbeRecord(node=rank // 2, rank=rank, pid=1000 + rank, thread=1, seq=self.seq,
                                     target="sgl_seat.sim.rowfetch:fetch_rows", start=start,
                                     end=None if dur is None else start + dur, gather_size=gather))

    def steady(self, t0: float, t1: float, period: float = 0.2, base_ms: float = 2.0) -> Seat:
        for rank in range(self.ranks):
            t, i = t0, 0
            while t < t1:
                g = GATHERS[i % len(GATHERS)]
                # a few ms, growing mildly with the gather, with jitter
                self.add(rank, t, (base_ms + g / 200.0) * self.rng.uniform(0.7, 1.3) / 1e3, g)
                t += period
                i += 1
        return self


def test_a_steady_seat_raises_no_warning() -> None:
    """GIVEN 90 s of steady fetches on 4 ranks WHEN judged at several instants THEN no warning."""
    seat = Seat().steady(0.0, 90.0)
    for now in (30.0, 60.0, 89.0):
        assert detect_prehang(seat.recs, now) is None


def test_a_growing_tail_at_the_largest_gather_names_the_rank_and_bucket() -> None:
    """GIVEN steady fetches, then rank 3's fetches at gather 700 take 80-200 ms in the last 10 s
    THEN the warning names rank 3, its node and bucket 512-1023, with the baseline it grew from."""
    seat = Seat().steady(0.0, 80.0)
    for k, t in enumerate((72.0, 74.0, 76.0, 78.0)):
        seat.add(3, t + 0.05, 0.08 + 0.04 * k, 700)
    w = detect_prehang(seat.recs, 80.0)
    assert w is not None
    assert (w.rank, w.node, w.gather) == (3, 1, "512-1023")
    assert w.slow == 4 and w.recent_p99_s == pytest.approx(0.2)
    assert w.baseline_p99_s < 0.01 and w.ratio > 20
    assert "rank 3" in w.evidence[0] and w.evidence[1].startswith("gather 512-1023: 4 slow of")
    assert w.summary().startswith(PREHANG_KIND + ": rank 3 node 1 gather 512-1023")


def test_a_new_larger_gather_being_slower_is_no_trend() -> None:
    """GIVEN steady fetches, then rank 1 gathers 4000 rows (a bucket never seen before) taking 100 ms
    THEN no warning: a larger gather may be slower; there is no baseline to grow from."""
    seat = Seat().steady(0.0, 80.0)
    for t in (70.0, 72.0, 74.0, 76.0, 78.0):
        seat.add(1, t + 0.05, 0.1, 4000)
    assert detect_prehang(seat.recs, 80.0) is None
    judged = [r.gather for r in tail_readings(seat.recs, 80.0) if r.rank == 1]
    assert judged == ["512-1023", "64-127"]  # the known buckets, largest first; 2048-4095 has no baseline


def test_new_larger_gathers_do_not_hide_a_known_bucket_slowing_down() -> None:
    """GIVEN rank 3 slowing at gather 700 while the slowed seat now also gathers 2000 and 4000 rows (buckets
    with no baseline) THEN the warning still names bucket 512-1023."""
    seat = Seat().steady(0.0, 80.0)
    for k, t in enumerate((72.0, 74.0, 76.0, 78.0)):
        seat.add(3, t + 0.05, 0.15, 700)
        seat.add(3, t + 0.5, 0.1, 2000 if k % 2 else 4000)
    w = detect_prehang(seat.recs, 80.0)
    assert w is not None and (w.rank, w.gather) == (3, "512-1023")


def test_one_outlier_is_not_a_tail() -> None:
    """GIVEN steady fetches and two slow ones on rank 2 (fewer than min_slow) THEN no warning."""
    seat = Seat().steady(0.0, 80.0)
    seat.add(2, 75.05, 0.5, 700)
    seat.add(2, 77.05, 0.5, 700)
    assert detect_prehang(seat.recs, 80.0) is None
    assert detect_prehang(seat.recs, 80.0, WarningRule(min_slow=2)) is not None


def test_jitter_below_the_floor_is_not_a_tail() -> None:
    """GIVEN fetches of ~10 us that grow to 1 ms (100x, but under the 30 ms floor) THEN no warning."""
    seat = Seat().steady(0.0, 80.0, base_ms=0.0)  # 0.04-3.5 ms by gather
    for t in (72.0, 74.0, 76.0, 78.0):
        seat.add(0, t + 0.05, 0.02, 8)  # bucket 8-15: baseline ~0.04 ms
    assert detect_prehang(seat.recs, 80.0) is None
    assert detect_prehang(seat.recs, 80.0, WarningRule(floor_s=0.01, top_buckets=3)) is not None


def test_a_slowdown_at_a_small_gather_is_not_judged() -> None:
    """GIVEN the slowdown at the smallest of three buckets only THEN no warning (the top two are judged)."""
    seat = Seat().steady(0.0, 80.0)
    for t in (72.0, 74.0, 76.0, 78.0):
        seat.add(0, t + 0.05, 0.3, 8)
    assert detect_prehang(seat.recs, 80.0) is None
    assert detect_prehang(seat.recs, 80.0, WarningRule(top_buckets=3)) is not None


def test_rare_large_gathers_leave_room_for_the_busy_bucket() -> None:
    """GIVEN a rank that gathers 700 and 100 rows only every 4 s and 8 rows every 0.2 s, and its 8-row fetches
    slow down THEN the warning names bucket 8-15: the two largest hold too few recent fetches (8 < min_recent)
    to read a tail from, so the next bucket is judged too; with min_recent 0 it is not."""
    seat = Seat(ranks=0)
    t = 0.0
    while t < 80.0:
        seat.add(0, t, 0.002, 8)
        t += 0.2
    for t in range(0, 80, 4):
        seat.add(0, t + 0.1, 0.004, 700)
        seat.add(0, t + 0.15, 0.003, 100)
    for t in (74.05, 75.05, 76.05, 77.05):
        seat.add(0, t, 0.12, 8)
    w = detect_prehang(seat.recs, 80.0)
    assert w is not None and (w.rank, w.gather) == (0, "8-15")
    assert detect_prehang(seat.recs, 80.0, WarningRule(min_recent=0)) is None


def test_a_fetch_in_flight_counts_with_its_age() -> None:
    """GIVEN two slow completed fetches and a third still in flight for 1 s (under the stall threshold)
    THEN the warning fires and says one is in flight; without the in-flight one it does not."""
    seat = Seat().steady(0.0, 80.0)
    seat.add(3, 74.05, 0.2, 700)
    seat.add(3, 76.05, 0.2, 700)
    assert detect_prehang(seat.recs, 80.0) is None
    seat.add(3, 79.0, None, 700)
    w = detect_prehang(seat.recs, 80.0)
    assert w is not None and w.rank == 3 and w.recent_p99_s == pytest.approx(1.0)
    assert any("in flight" in e for e in w.evidence)


def test_records_after_now_are_ignored() -> None:
    """GIVEN the slow fetches happen after ``now`` THEN the warning at ``now`` does not see them."""
    seat = Seat().steady(0.0, 80.0)
    for t in (82.0, 84.0, 86.0, 88.0):
        seat.add(3, t, 0.2, 700)
    assert detect_prehang(seat.recs, 80.0) is None
    assert detect_prehang(seat.recs, 89.0) is not None


def test_first_warning_gives_the_onset_before_the_stall() -> None:
    """GIVEN rank 3's fetches at gather 700 take 100 ms from t=100 (one every second) and then stall at t=120
    WHEN the warning is evaluated every second from t=60 THEN it is first raised at t=103 (the third slow fetch
    ended at 102.1), well before the stall."""
    seat = Seat().steady(0.0, 125.0)
    for t in range(100, 120):
        seat.add(3, float(t), 0.1, 700)
    seat.add(3, 120.0, None, 700)
    w = first_warning(seat.recs, 60.0, 125.0)
    assert w is not None and w.t == pytest.approx(103.0) and w.rank == 3
    assert first_warning(seat.recs, 60.0, 99.0) is None
    with pytest.raises(ValueError):
        first_warning(seat.recs, 60.0, 99.0, step_s=0)


def test_columns_and_records_give_the_same_warning() -> None:
    """The sidecar and replay pass probe columns; a list of records is read the same way."""
    seat = Seat(seed=3).steady(0.0, 80.0)
    for k, t in enumerate((72.0, 74.0, 76.0)):
        seat.add(1, t + 0.05, 0.09 + 0.01 * k, 100)
    seat.add(1, 79.5, None, 100)
    cols = ProbeColumns.from_records(list(reversed(seat.recs)))
    assert detect_prehang(cols, 80.0) == detect_prehang(seat.recs, 80.0) is not None
    assert tail_readings(cols, 80.0) == tail_readings(seat.recs, 80.0)
    assert first_warning(cols, 60.0, 80.0) == first_warning(seat.recs, 60.0, 80.0)


def test_a_reading_without_a_baseline_has_no_ratio() -> None:
    r = TailReading(rank=0, node=0, gather_lo=8, gather_hi=15, recent_count=3, recent_p99_s=0.1, baseline_count=0,
                    baseline_p99_s=math.nan, slow=0, in_flight=0)
    assert math.isnan(r.ratio) and r.gather == "8-15"


def test_a_warning_round_trips_through_json_and_rejects_garbage() -> None:
    w = PreHangWarning(t=1.0, rank=3, node=1, gather="512-1023", recent_p99_s=0.2, baseline_p99_s=0.004, slow=4,
                       evidence=("x",))
    assert PreHangWarning.from_json(w.to_json()) == w
    for bad in ({}, {**w.to_json(), "kind": "other"}, {**w.to_json(), "rank": "three"},
                {**w.to_json(), "evidence": [1]}):
        with pytest.raises(RecordError):
            PreHangWarning.from_json(bad)


def test_the_shipped_rule_ties_its_floor_to_the_stall_threshold() -> None:
    assert WarningRule.for_stall(3.0).floor_s == pytest.approx(0.03)
    assert WarningRule.for_stall(3.0) == WarningRule()


def _write_bundle(root: Path, name: str, seat: Seat, trigger_t: float) -> Path:
    v = Verdict(VerdictKind.ROWFETCH_STALL, 3, 1, "fetch_rows (rowfetch.py:101)", trigger_t, ("late",), (0, 1, 2))
    fields = {"seat": "s", "trigger": {"t": trigger_t, "source": "detector"}, "verdict": v.to_json(),
              "nodes": [0, 1], "ranks": [0, 1, 2, 3], "time_range": {"start": 0.0, "end": trigger_t + 1.0},
              "thresholds": {"rowfetch_inflight_s": 3.0}, "created": trigger_t + 1.0}
    return write_bundle(root, name, fields, {layout.PROBE: encode_probe_records(seat.recs)}, quota_mb=100)


def test_replay_finds_the_warning_in_the_bundles_history(tmp_path: Path) -> None:
    """GIVEN a bundle whose row-fetch history has rank 3's tail growing from t=100 and its stall at t=120
    (trigger at 124) WHEN replayed THEN the report carries the warning raised 21 s before the trigger (at t=103,
    as a sidecar ticking each second would have); a bundle of the same seat without the slowdown carries none."""
    seat = Seat().steady(0.0, 125.0)
    for t in range(100, 120):
        seat.add(3, float(t), 0.1, 700)
    seat.add(3, 120.0, None, 700)
    res = replay_bundle(_write_bundle(tmp_path, "grow", seat, 124.0))
    assert res.warning is not None and res.warning.t == pytest.approx(103.0)
    doc = res.to_json()
    w = doc["prehang_warning"]
    assert (w["t_s"], w["rank"], w["node"], w["gather"]) == (-21.0, 3, 1, "512-1023")
    assert w["recent_p99_ms"] == pytest.approx(100.0)
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    for part in render_report(res):
        console.print(part)
    assert "pre-hang warning 21.0 s before the trigger: row-fetch tail growing: rank 3 node 1 gather 512-1023" \
        in buf.getvalue()

    calm = Seat().steady(0.0, 125.0)
    calm.add(3, 120.0, None, 700)
    res = replay_bundle(_write_bundle(tmp_path, "calm", calm, 124.0))
    assert res.warning is None and "prehang_warning" not in res.to_json()
