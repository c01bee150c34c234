"""What the sidecar exports for the alerts and the dashboard (latch, pre-hang warning, tail ratio, rank states), and
`watch` printing the warning: the exporter's registry read back, no HTTP, no Ray."""

from __future__ import annotations

import io

from prometheus_client import generate_latest
from rich.console import Console

from sgl_seat.cli.watchview import render
from sgl_seat.core.warning import PreHangWarning, TailReading
from sgl_seat.watchdog.exporter import RANK_STATES, Exporter
from sgl_seat.watchdog.rankview import RankView


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
    baseline never counts as a ratio)."""
    ex = Exporter(node=1, port=None)
    ex.observe_state(latched=True, warning=WARNING,
                     readings=[_reading(3, 0.2, 0.004, 40), _reading(2, 0.5, float("nan"), 0)],
                     ranks=[_view(2, "collective"), _view(3, "fetching")])
    assert _value(ex, "sgl_seat_watchdog_latched") == 1.0
    assert _value(ex, "sgl_seat_watchdog_prehang_warning") == 1.0
    assert _value(ex, "sgl_seat_watchdog_rowfetch_tail_ratio") == 50.0
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="3") == RANK_STATES["fetching"]
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="2") == RANK_STATES["collective"]
    ex.observe_state(latched=False, warning=None, readings=[], ranks=[_view(3, "running")])
    assert _value(ex, "sgl_seat_watchdog_latched") == 0.0
    assert _value(ex, "sgl_seat_watchdog_prehang_warning") == 0.0
    assert _value(ex, "sgl_seat_watchdog_rowfetch_tail_ratio") == 0.0
    assert _value(ex, "sgl_seat_watchdog_rank_state", rank="3") == RANK_STATES["running"]
    text = generate_latest(ex.registry).decode()
    assert "# HELP sgl_seat_watchdog_rank_state" in text and "3 fetching" in text  # the code table, in HELP


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
