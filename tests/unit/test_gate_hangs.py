"""The hangs gate in the report: hang bundles per serving hour, candidate over baseline, with its exact interval.

Why: the gate used to FAIL whenever the candidate hung once more than the baseline, which fails identical arms for
noise; now it follows the rate ratio's interval (``stats.judge_rate``), with each arm's serving time as exposure,
counted inside the window the bundles were counted in. Reports of schema 1.0 (counts, no ``verdict_of``) still render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sgl_seat.gate.design import cell_names, schedule
from sgl_seat.gate.report_html import render_html
from sgl_seat.gate.report_text import render_text
from sgl_seat.gate.runner import BatteryDir, start_battery
from sgl_seat.gate.verdict import build_report
from sgl_seat.gate.workloads import load_battery

KV = 1_040_128


def _battery(tmp_path: Path, hangs: dict[str, list[int]], *, seconds: float = 600.0, arms: list[str] | None = None,
             stale: bool = False) -> dict[str, Any]:
    """A battery of 3 runs whose every cell is on disk: equal KV pools, each traffic cell ``seconds`` long, hangs
    per arm and repetition as given. ``stale``: the baseline's traffic cells finished before its engine cell (a
    resumed slot whose hang window reopened), so they do not count as its serving time."""
    battery = load_battery(quick=True).with_runs(3)
    arms = arms or ["baseline", "candidate"]
    bd = start_battery(tmp_path / "b", battery, arms, {"kind": "fake"})
    t = 1_000_000.0
    for slot in schedule(arms, battery.runs):
        for name in cell_names(battery.levels()):
            t += seconds
            if name == "engine":
                data: dict[str, Any] = {"info": {"kv_pool_tokens": KV}, "cold": True, "bundles_before": []}
            elif name == "hangs":
                n = hangs[slot.arm][slot.rep]
                data = {"measured": True, "count": n, "bundles": [f"b{i}" for i in range(n)]}
            else:
                data = {"counters": {}} if name.startswith("sweep_c") else {}
            fin = t - 10 * seconds * len(cell_names(battery.levels())) if (
                stale and slot.arm == "baseline" and name not in ("engine", "hangs")) else t
            BatteryDir.write_json(bd, bd.cell_path(slot, name), {
                "schema_version": "1.0", "slot": slot.key, "arm": slot.arm, "rep": slot.rep,
                "position": slot.position, "cell": name, "data": data, "seconds": seconds, "finished": fin})
    return build_report(bd)


def _hangs(rep: dict[str, Any]) -> dict[str, Any]:
    return next(g for g in rep["gates"] if g["name"] == "hangs")


def test_serving_time_is_the_traffic_cells_inside_the_window(tmp_path: Path) -> None:
    """GIVEN traffic cells of 600 s each WHEN the report is built THEN each slot's serving time is their sum (the
    engine and hangs cells are not traffic) and the gate reports hours per arm."""
    rep = _battery(tmp_path, {"baseline": [0, 0, 0], "candidate": [0, 0, 0]})
    traffic = len(cell_names(load_battery(quick=True).levels())) - 2
    assert rep["arms"]["candidate"]["0"]["serving_s"] == pytest.approx(600.0 * traffic)
    g = _hangs(rep)
    assert g["candidate_hours"] == g["baseline_hours"] == pytest.approx(3 * 600.0 * traffic / 3600, rel=1e-3)
    assert g["outcome"] == "PASS" and g["ratio"] is None and g["bound"] == 1.0 and "no hang on either arm" in g["note"]
    assert rep["schema_version"] == "1.2" and rep["verdict_of"] == "candidate"


@pytest.mark.parametrize(("cand", "base", "outcome"), [
    ([0, 0, 0], [1, 0, 0], "PASS"),
    ([1, 0, 0], [0, 0, 0], "INCONCLUSIVE"),  # the old rule said FAIL: one more hang, on arms that may be identical
    ([2, 1, 1], [1, 1, 1], "INCONCLUSIVE"),
    ([2, 2, 2], [0, 0, 0], "FAIL"),
])
def test_hangs_gate_follows_the_rate_ratio_interval(tmp_path: Path, cand: list[int], base: list[int],
                                                    outcome: str) -> None:
    """GIVEN hang counts on equal serving time WHEN judged THEN FAIL only when the interval is above 1, PASS when the
    candidate hung no more often per hour, else INCONCLUSIVE; the text and HTML show the ratio and its interval."""
    rep = _battery(tmp_path, {"baseline": base, "candidate": cand})
    g = _hangs(rep)
    assert g["outcome"] == outcome, g
    assert (g["candidate"], g["baseline"], g["n"]) == (sum(cand), sum(base), 3)
    if sum(base) == 0 and sum(cand):
        assert g["ratio_infinite"] and g["ratio"] is None and g["ci_high"] is None
    if outcome == "FAIL":
        assert g["ci_low"] > 1.0 and rep["verdict"] == "DO_NOT_SHIP"
    text = render_text(rep)
    row = next(ln for ln in text.splitlines() if ln.startswith("hangs "))
    assert outcome in row and "<= 1" in row and "hang bundle(s)" in row
    if g["ratio_infinite"]:
        assert " inf " in row and f"[{g['ci_low']:.3f}, inf]" in row
    assert "per serving hour" in render_html(rep)


def test_traffic_outside_the_hang_window_is_not_exposure(tmp_path: Path) -> None:
    """GIVEN the baseline's traffic cells outside its hangs window (stale after a resume) WHEN reported THEN they are
    not its serving time: with no baseline exposure and a candidate hang there is no rate, so INCONCLUSIVE."""
    rep = _battery(tmp_path, {"baseline": [0, 0, 0], "candidate": [1, 0, 0]}, stale=True)
    g = _hangs(rep)
    assert rep["arms"]["baseline"]["0"]["serving_s"] == 0.0 and g["baseline_hours"] == 0.0
    assert g["outcome"] == "INCONCLUSIVE" and "no serving time" in g["note"]


def test_aa_battery_reports_the_control_verdict(tmp_path: Path) -> None:
    """GIVEN baseline and control only WHEN reported THEN the verdict and gates are the control's against the
    baseline, and hangs on identical arms (one each) PASS."""
    rep = _battery(tmp_path, {"baseline": [1, 0, 0], "control": [0, 1, 0]}, arms=["baseline", "control"])
    assert rep["verdict_of"] == "control" and rep["gates"] == rep["comparisons"]["control"]["gates"]
    assert _hangs(rep)["outcome"] == "PASS" and rep["crossover"] is None
    assert "VERDICT (control vs baseline, A/A rehearsal: identical arms)" in render_text(rep)
    assert "Gates (control / baseline" in render_html(rep)


def test_a_schema_1_0_report_still_renders(tmp_path: Path) -> None:
    """GIVEN a report as 1.0 wrote it (no verdict_of; the hangs gate with counts, no bound or interval) WHEN rendered
    THEN text and HTML come out as before: the candidate's verdict, "<= base" for hangs."""
    rep = _battery(tmp_path, {"baseline": [0, 0, 0], "candidate": [0, 0, 0]})
    rep["schema_version"] = "1.0"
    rep.pop("verdict_of")
    for g in rep["gates"]:
        if g["name"] == "hangs":
            for k in ("bound", "ratio_infinite", "candidate_hours", "baseline_hours"):
                g.pop(k)
            g.update(ratio=None, ci_low=None, ci_high=None)
    text = render_text(rep)
    assert "VERDICT (candidate vs baseline): " in text
    assert "<= base" in next(ln for ln in text.splitlines() if ln.startswith("hangs "))
    assert "Gates (candidate / baseline" in render_html(rep)
