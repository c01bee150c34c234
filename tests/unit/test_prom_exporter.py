"""What the sidecar exports for the alerts and the dashboard (latch, pre-hang warning, tail ratio, rank states), the
sidecar's detection pass raising the warning, and `watch` printing it: the exporter's registry read back, no HTTP,
no engine, no Ray. Latencies are synthetic."""

from __future__ import annotations

import io
from pathlib import Path

from prometheus_client import generate_latest
from rich.console import Console

from sgl_seat.cli.watchview import render
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import ProbeRecord
from sgl_seat.core.warning import PreHangWarning, TailReading
from sgl_seat.engines import words_for
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.prometheus.exporter import RANK_STATES, Exporter
from sgl_seat.watchdog.rankview import RankView
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar

WORDS = words_for("sglang")

def _value(ex: Exporter, name: str, **labels: str) -> float | None:
    v = ex.registry.get_sample_value(name, {"node": "1", **labels})
    return None if v is None else float(v)


def _view(rank: int, state: str) -> RankView:
    return RankView(rank=rank, node=1, pid=100 + rank, state=state, frame=None, fetch_p50_ms=None,
                    fetch_p99_ms=None, inflight_age_s=None, fetches=0)


def _reading(rank: int, recent: float, base: float, count: int) -> TailReading:
    return TailReading(rank=rank, node=1, gather_lo=512, gather_hi=1023, recent_count=5, recent_p99_s=recent,
                       baseline_count=count, baseline_p99_s=base, slow=0, in_flight=0)


WARNING = PreHangWarning(t=10.0, rank=3, node=1, gather="512-1023", recent_p99_s=0.2, baseline_p99_s=0.004, slow=4)


def test_the_state_gauges_follow_what_the_sidecar_concluded() -> None:
    """GIVEN a latched sidecar with a warning, a tail reading of 50x and ranks fetching / in a collective
    THEN the gauges say so; WHEN it re-arms and the warning clears THEN they drop to 0 (a reading without a
    baseline never counts as a ratio). Rank states are read from the sidecar when scraped."""
    ex = Exporter(node=1, port=None)
    views = [_view(2, "collective"), _view(3, "fetching")]
    ex.rank_states.source = lambda: views
    ex.observe_state(latched=True, warning=WARNING,
                     readings=[_reading(3, 0.2, 0.004, 40), _reading(2, 0.5, float("nan"), 0)])
    assert _value(ex, "sgl_seat_watchdog_latched") == 1.0
    assert _value(ex, "sgl_seat_watchdog_prehang_warning") == 1.0
    assert _value(ex, "sgl_seat_watchdog_rowfetch_tail_ratio") == 50.0
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="3") == RANK_STATES["fetching"]
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="2") == RANK_STATES["collective"]
    ex.observe_state(latched=False, warning=None, readings=[])
    views = [_view(3, "running")]
    assert _value(ex, "sgl_seat_watchdog_latched") == 0.0
    assert _value(ex, "sgl_seat_watchdog_prehang_warning") == 0.0
    assert _value(ex, "sgl_seat_watchdog_rowfetch_tail_ratio") == 0.0
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="3") == RANK_STATES["running"]
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="2") is None
    text = generate_latest(ex.registry).decode()
    assert "# HELP sgl_seat_watchdog_rank_state" in text and "3 fetching" in text  # the code table, in HELP


def test_a_failing_rank_view_does_not_fail_the_scrape() -> None:
    """A scrape that failed would read as the sidecar being down (SglSeatSidecarDown): the family is served empty."""
    ex = Exporter(node=1, port=None)

    def boom() -> list[RankView]:
        raise RuntimeError("synthetic failure")

    ex.rank_states.source = boom
    text = generate_latest(ex.registry).decode()
    assert "# TYPE sgl_seat_watchdog_rank_state gauge" in text and "sgl_seat_watchdog_latched" in text


def test_watch_prints_the_warning_under_the_ranks() -> None:
    doc = {"schema_version": 1, "seat": "s", "t": 0.0, "state": "READY", "endpoint": None, "error": None,
           "bundles": [],
           "nodes": [{"node": 1, "sampler": "ok", "tokens_per_s": 10.0, "verdict": None, "latched": False,
                      "warning": WARNING.to_json(), "ranks": [_view(3, "running").to_json()]},
                     {"node": 0, "sampler": "ok", "warning": {"kind": "from a newer sidecar"}, "ranks": []}]}
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render(doc))
    out = buf.getvalue()
    assert ("node 1: warning: row-fetch tail growing: rank 3 node 1 gather 512-1023, p99 200.0 ms vs 4.0 ms before "
            "(50.0x, 4 slow)") in out
    assert "node 0: warning: row-fetch tail growing" in out  # an unreadable warning still says there is one


def _rec(seq: int, start: float, dur: float | None, gather: int, rank: int = 3) -> ProbeRecord:
    return ProbeRecord(node=1, rank=rank, pid=100 + rank, thread=1, seq=seq, target="m:fetch_rows", start=start,
                       end=None if dur is None else start + dur, gather_size=gather)


def test_the_sidecar_raises_exports_and_snapshots_the_warning(tmp_path: Path) -> None:
    """GIVEN a node-1 sidecar (no engine, py-spy off) WHEN its detection pass sees rank 3's fetches at gather 700
    take 2 ms for a minute and then 150 ms THEN it holds the warning, exports it (gauge 1, tail ratio ~75x) and
    `watch`'s snapshot carries it; WHEN the tail is back to normal THEN all of it clears."""
    cfg = SidecarConfig(seat="s", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path))
    sc = Sidecar(cfg, sampler=Sampler(node=1, discover=lambda: [], pyspy=False))
    try:
        recs = [_rec(i, 10.0 + 0.5 * i, 0.002, 700) for i in range(120)]  # t = 10 .. 69.5
        slow = [_rec(200 + i, 70.0 + i, 0.15, 700) for i in range(4)]
        sc.warn(Observation.of(words=WORDS, probes=recs + slow), 75.0)
        assert sc.warning is not None and (sc.warning.rank, sc.warning.gather) == (3, "512-1023")
        assert _value(sc.exporter, "sgl_seat_watchdog_prehang_warning") == 1.0
        ratio = _value(sc.exporter, "sgl_seat_watchdog_rowfetch_tail_ratio")
        assert ratio is not None and 70.0 < ratio < 80.0
        assert _value(sc.exporter, "sgl_seat_watchdog_rank_state", rank="3") is None  # no engine: no ranks seen
        assert sc.snapshot()["warning"]["rank"] == 3
        calm = [_rec(300 + i, 70.0 + i, 0.002, 700) for i in range(4)]
        sc.warn(Observation.of(words=WORDS, probes=recs + calm), 75.0)
        assert sc.warning is None and sc.snapshot()["warning"] is None
        assert _value(sc.exporter, "sgl_seat_watchdog_prehang_warning") == 0.0
    finally:
        sc.exporter.close()


def test_remediations_are_counted_by_action_and_outcome_from_zero() -> None:
    """GIVEN a fresh exporter THEN every (action, outcome) series exists at 0 (an alert on increase() needs the 0);
    WHEN the supervisor counts a rollback that served and a refusal THEN those series are 1 and the exhausted gauge
    is 1 until it is cleared; a pending remediation or a refusal that 'served' is refused as a miscount."""
    import pytest

    from sgl_seat.core.remediation import Action, Outcome

    ex = Exporter(node=1, port=None)
    total = "sgl_seat_remediations_total"
    for action, outcome in ex.remediation.PAIRS:
        assert _value(ex, total, action=action, outcome=outcome) == 0.0
    assert ("restart", "serving") in ex.remediation.PAIRS and ("refused-budget", "not-acted") in ex.remediation.PAIRS
    assert _value(ex, "sgl_seat_remediation_exhausted") == 0.0
    ex.remediation_done(Action.ROLLBACK_DRAFT, Outcome.SERVING)
    ex.remediation_done("restart", "failed")
    assert _value(ex, total, action="rollback-draft", outcome="serving") == 1.0
    assert _value(ex, total, action="restart", outcome="failed") == 1.0
    assert _value(ex, "sgl_seat_remediation_exhausted") == 0.0
    ex.remediation_done(Action.REFUSED_BUDGET, Outcome.NOT_ACTED)
    assert _value(ex, total, action="refused-budget", outcome="not-acted") == 1.0
    assert _value(ex, "sgl_seat_remediation_exhausted") == 1.0
    ex.remediation.set_exhausted(False)
    assert _value(ex, "sgl_seat_remediation_exhausted") == 0.0
    for action, outcome in (("restart", "pending"), ("refused-budget", "serving"), ("reboot", "serving")):
        with pytest.raises(ValueError):
            ex.remediation_done(action, outcome)
    text = generate_latest(ex.registry).decode()
    assert 'sgl_seat_remediations_total{action="rollback-draft",node="1",outcome="serving"} 1.0' in text
