"""The gate report as terminal text: the verdict, one row per gate with its interval and the A/A noise floor,
single-stream (reported, never gated), the sweep, the crossover and the recommendation.

Why a fixed-width table of ratios: the decision is read off the intervals, so every ratio is printed with its
interval and the noise floor beside it, never a bare point estimate (the hangs gate's is a rate ratio: hangs per
serving hour). A report of sim figures says so first. Reports of schema 1.0 (no ``verdict_of``, a hangs gate of
counts) render as they did.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_text"]


def _r(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ci(d: dict[str, Any]) -> str:
    if d.get("ci_low") is None and d.get("ci_high") is None:
        return "-" if d.get("ratio") is None else "(n=1: no interval)"
    hi = "inf" if d.get("ci_high") is None else f"{d['ci_high']:.3f}"
    return f"[{_r(d.get('ci_low'))}, {hi}]"


def _floor(g: dict[str, Any]) -> str:
    nf = g.get("noise_floor")
    if not nf or nf.get("half_width") is None:
        return "-"
    return f"+/-{nf['half_width'] * 100:.1f}%"


def render_text(rep: dict[str, Any]) -> str:
    out: list[str] = []
    if rep.get("synthetic"):
        out.append(f"*** {rep['synthetic_note']} ***")
    if rep.get("note"):
        out.append(f"*** {rep['note']} ***")
    d = rep["design"]
    out.append(f"gate: arms {', '.join(d['arms'])}; {d['runs']} run(s) per arm, ABBA order; sweep {d['levels']}")
    subject = rep.get("verdict_of", "candidate")  # a 1.0 report has no verdict_of: it was the candidate's
    rehearsal = ", A/A rehearsal: identical arms" if subject == "control" else ""
    out.append(f"VERDICT ({subject} vs baseline{rehearsal}): {rep['verdict']}")
    out.append("")
    out.append(f"{'gate':<18} {'ratio':>7}  {'95% interval':<20} {'threshold':>10}  {'A/A floor':>10}  outcome")
    for g in rep["gates"]:
        if g["metric"] == "hangs":
            thr = "<= base" if g.get("bound") is None else f"<= {g['bound']:g}"  # a 1.0 report compared counts
            ratio = "inf" if g.get("ratio_infinite") else _r(g.get("ratio"))
            out.append(f"{g['name']:<18} {ratio:>7}  {_ci(g):<20} {thr:>10}  {'-':>10}  {g['outcome']}  "
                       f"({g.get('note', '')})")
            continue
        thr = (">= " if g["higher_is_better"] else "<= ") + f"{g['threshold']:g}"
        note = "" if g.get("measured", True) else f"  ({g.get('note', 'not measured')})"
        out.append(f"{g['name']:<18} {_r(g['ratio']):>7}  {_ci(g):<20} {thr:>10}  {_floor(g):>10}  "
                   f"{g['outcome']}{note}")
    out.append("")
    for arm, ss in rep["single_stream"].items():
        out.append(f"single-stream {arm}/baseline: {_r(ss.get('ratio'))} {_ci(ss)} (reported, not gated)")
    for arm, comp in rep["comparisons"].items():
        if arm == subject:
            continue
        fails = [g["name"] for g in comp["gates"] if g["outcome"] == "FAIL"]
        out.append(f"{arm}: verdict {comp['verdict']}" + (f" (FAIL: {', '.join(fails)})" if fails else ""))
    out.append("")
    arms = [a for a in rep["comparisons"]]
    out.append("output tok/s ratio vs baseline by concurrency: " + "  ".join(arms))
    levels = d["levels"]
    for i, c in enumerate(levels):
        cells = []
        for arm in arms:
            s = rep["comparisons"][arm]["sweep"][i]
            cells.append(f"{_r(s.get('ratio'))} {_ci(s)}")
        out.append(f"  c={c:<4} " + "   ".join(f"{x:<28}" for x in cells))
    cx = rep.get("crossover")
    if cx:
        if cx["below_sweep"]:
            where = f"below the smallest level ({levels[0]})"
        elif cx["beyond_sweep"]:
            where = f"beyond the largest level ({levels[-1]})"
        else:
            where = f"{_r(cx['estimate'], 1)}"
        out.append(f"crossover concurrency (draft stops paying): {where}; interval "
                   f"[{_r(cx['ci_low'], 1)}, {_r(cx['ci_high'], 1)}] (- : outside the sweep)")
    rec = rep.get("recommendation")
    if rec:
        out.append(f"recommendation: {rec['text']}")
        out.append(f"  {rec['action']}")
    gi = rep.get("greedy_identity") or {}
    aa = gi.get("aa")
    for arm, v in gi.items():
        if isinstance(v, dict) and "vs_baseline" in v and v["vs_baseline"]:
            vb = v["vs_baseline"]
            out.append(f"greedy identity {arm} vs baseline: {vb['identical']}/{vb['of']}; A/A "
                       f"{'-' if not aa else str(aa['identical']) + '/' + str(aa['of'])} ({gi.get('aa_source')}): "
                       f"{v['judged'] or 'not judged'}")
    if rep.get("noise_floor_note"):
        out.append(f"note: {rep['noise_floor_note']}")
    co = rep.get("client_overhead") or {}
    if co.get("loop_lag_ms_max") is not None:
        out.append(f"client overhead: event-loop lag up to {co['loop_lag_ms_max']:.1f} ms, "
                   f"{co['cpu_s_per_request_max'] * 1000:.2f} ms CPU per request at most")
    if not rep["complete"]:
        out.append(f"INCOMPLETE: {len(rep['missing_cells'])} cell(s) missing (resume with --resume DIR)")
    if rep.get("synthetic"):
        out.append(f"*** {rep['synthetic_note']} ***")
    return "\n".join(out) + "\n"
