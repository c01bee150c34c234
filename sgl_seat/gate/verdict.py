"""From a battery directory's cells to the versioned report: per-arm figures, paired comparisons, gates, verdict.

Why it reads only the cells on disk: a report can be recomputed at any time (after a resume, on another machine)
from the same files, and nothing measured is ever held only in memory.

- Every non-baseline arm (candidate, hybrid, control) is compared with the baseline by paired log-ratios over the
  repetitions both ran, with a 95 % interval (:mod:`sgl_seat.gate.intervals`), and judged by the same gate rows.
- The control arm is the baseline again: its comparison is the A/A noise floor, reported beside every ratio. A/A
  should never FAIL; if it does, the machine is too noisy for the battery's n.
- Single-stream is reported with its interval and never gated. Greedy identity is judged against the A/A
  identity rate (the engine's own non-determinism), not against 100 %.
- The verdict is the candidate's: DO_NOT_SHIP if any gate FAILs, SHIP if all PASS, else INCONCLUSIVE. Without a
  candidate it is the hybrid's (``--arms baseline,hybrid,control``: a seat's draft policy after ``sgl-seat tune
  draft``); without either (``--arms baseline,control``, an A/A rehearsal before a real battery) the control's, by
  the same gates: SHIP then says identical arms resolve every gate on this machine at this n, DO_NOT_SHIP that a
  gate FAILed on identical arms (the machine or the battery is not fit to decide), INCONCLUSIVE that more runs are
  needed.
  ``verdict_of`` names the arm.
- The hangs gate is a rate ratio, not a paired one: hang bundles per hour of serving time (the seconds of the
  traffic cells inside the window the bundles were counted in), candidate over baseline, with the exact interval
  of :func:`sgl_seat.gate.intervals.rate_ratio`, judged by :func:`sgl_seat.gate.intervals.judge_rate` against ``1 +
  threshold`` (the rule's threshold is the tolerated excess: 0, the shipped value, is "no higher than the
  baseline's", which is what it meant when the gate compared counts).
- A pipeline acts on the verdict through :data:`EXIT_CODES` (the CLI's exit status).

Report versions (``schema_version``; readers take any 1.x):

- 1.0: the first report.
- 1.1: the hangs gate carries its rate ratio and interval (``ratio``, ``ci_low``, ``ci_high``,
  ``ratio_infinite``), ``bound``, ``candidate_hours`` and ``baseline_hours``; each arm's figures carry
  ``serving_s``; the report carries ``verdict_of`` (``candidate``, or ``control`` for an A/A battery).
- 1.2: ``note``, the operator's words about what was measured (``gate --note``: e.g. that the model has random
  weights), shown at the top of the text and HTML; ``verdict_of`` may be ``hybrid`` (no candidate arm).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from sgl_seat import __version__
from sgl_seat.gate.design import BASELINE, CANDIDATE, CONTROL, HYBRID, cell_names, schedule
from sgl_seat.gate.intervals import (
    Interval,
    Outcome,
    band_of,
    crossover,
    judge,
    judge_rate,
    paired_log_ratio,
    rate_ratio,
)
from sgl_seat.gate.runner import BatteryDir
from sgl_seat.gate.workloads import Battery, GateRule

__all__ = ["DO_NOT_SHIP", "EXIT_CODES", "INCONCLUSIVE", "REPORT_SCHEMA_VERSION", "SHIP", "SYNTHETIC_NOTE",
           "build_report", "exit_code"]

REPORT_SCHEMA_VERSION = "1.2"
SYNTHETIC_NOTE = ("SYNTHETIC: every figure in this report comes from sgl-seat's sim engine (a cost model, not a "
                  "GPU); it checks the battery and the seat plumbing, not SGLang's performance")
SHIP, DO_NOT_SHIP, INCONCLUSIVE = "SHIP", "DO_NOT_SHIP", "INCONCLUSIVE"
#: The exit status of ``sgl-seat gate`` for each verdict, so that a deployment pipeline can act on it. 2 stays the
#: usage error's (click's and :class:`sgl_seat.errors.UsageError`'s); any other SeatError exits with its own code.
EXIT_CODES = {SHIP: 0, DO_NOT_SHIP: 1, INCONCLUSIVE: 3}
#: The cells that are not traffic: what the engine reports, and the bundles listed at the slot's end.
_NOT_SERVING = ("engine", "hangs")


def exit_code(verdict: str) -> int:
    """The exit status for ``verdict``; an unknown one is INCONCLUSIVE's (never 0: a pipeline must not ship on it)."""
    return EXIT_CODES.get(verdict, EXIT_CODES[INCONCLUSIVE])


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def _arm_figures(battery: Battery, cells: dict[tuple[str, str], dict[str, Any]], slot_key: str) -> dict[str, Any]:
    """One slot's figures (None where a cell is missing or was not measured)."""

    def data(cell: str) -> dict[str, Any] | None:
        doc = cells.get((slot_key, cell))
        return None if doc is None else doc["data"]

    eng, cold, greedy, prefix, hangs = (data(c) for c in ("engine", "cold_ttft", "greedy", "prefix", "hangs"))
    # The hangs window opens when the engine cell lists the bundles already there (a resumed slot writes it again),
    # so the serving time that exposes the arm to a hang is that of the traffic cells finished after it.
    eng_doc = cells.get((slot_key, "engine"))
    since = _num(eng_doc.get("finished")) if eng_doc else None
    serving = 0.0
    for name in cell_names(battery.levels()):
        doc = cells.get((slot_key, name))
        if name in _NOT_SERVING or doc is None or since is None:
            continue
        fin, secs = _num(doc.get("finished")), _num(doc.get("seconds"))
        if fin is not None and secs is not None and fin >= since:
            serving += secs
    sweep: dict[int, dict[str, Any]] = {}
    gen = verify = 0.0
    for c in battery.levels():
        d = data(f"sweep_c{c}")
        if d is not None:
            sweep[c] = d
            gen += d["counters"].get("generated", 0.0)
            verify += d["counters"].get("verify_steps", 0.0)
    info = (eng or {}).get("info") or {}
    return {
        "kv_pool_tokens": _num(info.get("kv_pool_tokens")),
        "max_running_requests": _num(info.get("max_running_requests")),
        "synthetic": bool(info.get("synthetic")),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "speculative_adaptive": info.get("speculative_adaptive"),
        "up_s": _num((eng or {}).get("up_s")),
        "cold_ttft_s": _num(cold.get("ttft_s")) if cold and cold.get("ok") else None,
        "single_stream_tok_s": _num(greedy.get("output_tok_s")) if greedy and "output_tok_s" in greedy else None,
        "greedy_texts": greedy.get("texts") if greedy else None,
        "greedy_after_restart": greedy.get("after_restart") if greedy else None,
        "sweep_output_tok_s": {c: _num(d.get("output_tok_s")) for c, d in sweep.items()},
        "sweep_ttft_s": {c: _num(d.get("ttft_s_median")) for c, d in sweep.items()},
        "sweep_tpot_s": {c: _num(d.get("tpot_s_median")) for c, d in sweep.items()},
        "sweep_failed": {c: d.get("failed", 0) for c, d in sweep.items()},
        "client": {c: d.get("client") for c, d in sweep.items()},
        "prefix_hit_rate_warm": _num(prefix.get("hit_rate_warm")) if prefix else None,
        "prefix_hit_rate_cold": _num(prefix.get("hit_rate_cold")) if prefix else None,
        "prefix_hit_rate_all": _num(prefix.get("hit_rate_all")) if prefix else None,
        "hangs": hangs.get("count") if hangs and hangs.get("measured") else None,
        "serving_s": round(serving, 3) if since is not None else None,
        "hang_bundles": hangs.get("bundles", []) if hangs else [],
        "accept_length": gen / verify if verify else None,
    }


def _metric(fig: dict[str, Any], metric: str, at: int | None) -> float | None:
    if metric == "sweep_output_tok_s":
        v: Any = (fig.get("sweep_output_tok_s") or {}).get(at)
    else:
        v = fig.get(metric)
    return _num(v)


def _pairs(figs: dict[str, dict[int, dict[str, Any]]], arm: str, metric: str,
           at: int | None = None) -> tuple[list[float], list[float]]:
    base, cand = [], []
    for rep, fb in sorted(figs.get(BASELINE, {}).items()):
        fc = figs.get(arm, {}).get(rep)
        if fc is None:
            continue
        b, c = _metric(fb, metric, at), _metric(fc, metric, at)
        if b is not None and c is not None:
            base.append(b)
            cand.append(c)
    return base, cand


def _interval(base: list[float], cand: list[float]) -> Interval | None:
    if not base:
        return None
    if base == cand:  # identical (a pool size, a hit rate on a deterministic seat): an exact ratio of 1
        return Interval(1.0, 1.0, 1.0, len(base), 0.0)
    if any(v <= 0 for v in (*base, *cand)):
        return None
    return paired_log_ratio(base, cand)


def _hangs_gate(rule: GateRule, figs: dict[str, dict[int, dict[str, Any]]], arm: str,
                out: dict[str, Any]) -> dict[str, Any]:
    """Hang bundles per serving hour, ``arm`` over the baseline, over the repetitions both measured."""
    reps = []
    for rep, fb in sorted(figs.get(BASELINE, {}).items()):
        fc = figs.get(arm, {}).get(rep)
        if fc is not None and fb["hangs"] is not None and fc["hangs"] is not None:
            reps.append((int(fc["hangs"]), fc.get("serving_s") or 0.0, int(fb["hangs"]), fb.get("serving_s") or 0.0))
    a, b = sum(r[0] for r in reps), sum(r[2] for r in reps)
    ta, tb = sum(r[1] for r in reps), sum(r[3] for r in reps)
    bound = 1.0 + rule.threshold
    out.update(ratio=None, ci_low=None, ci_high=None, ratio_infinite=False, n=len(reps),
               baseline=b if reps else None, candidate=a if reps else None, bound=bound,
               candidate_hours=round(ta / 3600, 4) if reps else None,
               baseline_hours=round(tb / 3600, 4) if reps else None, noise_floor=None)
    if not reps:
        out.update(outcome=Outcome.INCONCLUSIVE.value, measured=False,
                   note="no watchdog bundles were read for these arms (watchdog off, or running seats)")
        return out
    counts = f"{a} hang bundle(s) in {ta / 3600:.2f} h of serving with this arm, {b} in {tb / 3600:.2f} h with " \
             f"the baseline, over {len(reps)} repetition(s)"
    if ta <= 0 or tb <= 0:  # no rate without serving time; without a hang there is nothing to weigh either
        out.update(outcome=(Outcome.PASS if a + b == 0 else Outcome.INCONCLUSIVE).value, measured=True,
                   note=f"{counts}; " + ("no hang on either arm" if a + b == 0 else "no serving time recorded, so "
                                         "no rate"))
        return out
    rr = rate_ratio(a, ta / 3600, b, tb / 3600)
    outcome = judge_rate(rr, bound)
    why = {Outcome.FAIL: f"the whole interval is above {bound:g}",
           Outcome.PASS: f"the rate ratio is at most {bound:g}" if rr.ratio is not None else "no hang on either arm",
           Outcome.INCONCLUSIVE: f"the rate ratio is above {bound:g}, but its interval reaches down to {bound:g} "
                                 "(more runs decide)"}[outcome]
    out.update(rr.to_json(), outcome=outcome.value, measured=True, note=f"{counts}; {why}")
    return out


def _gate(rule: GateRule, figs: dict[str, dict[int, dict[str, Any]]], arm: str,
          floor: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": rule.name, "metric": rule.metric, "at": rule.at, "threshold": rule.threshold,
                           "higher_is_better": rule.higher_is_better}
    if rule.metric == "hangs":
        return _hangs_gate(rule, figs, arm, out)
    base, cand = _pairs(figs, arm, rule.metric, rule.at)
    iv = _interval(base, cand)
    key = rule.metric if rule.at is None else f"{rule.metric}@{rule.at}"
    out["noise_floor"] = (floor or {}).get(key)
    if iv is None:
        out.update(ratio=None, ci_low=None, ci_high=None, n=len(base), outcome=Outcome.INCONCLUSIVE.value,
                   measured=bool(base), note="not measured" if not base else "a zero value: no ratio")
        return out
    out.update(iv.to_json(), outcome=judge(iv, rule.threshold, higher_is_better=rule.higher_is_better).value,
               measured=True)
    return out


def _verdict(gates: list[dict[str, Any]]) -> str:
    outs = [g["outcome"] for g in gates]
    if Outcome.FAIL.value in outs:
        return DO_NOT_SHIP
    if outs and all(o == Outcome.PASS.value for o in outs):
        return SHIP
    return INCONCLUSIVE


def _identity(a: list[str | None] | None, b: list[str | None] | None) -> dict[str, Any] | None:
    if not a or not b or len(a) != len(b):
        return None
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if not pairs:
        return None
    same = sum(x == y for x, y in pairs)
    divergence = []
    for x, y in pairs:
        if x != y:
            xs, ys = x.split(), y.split()
            divergence.append(next((i for i, (p, q) in enumerate(zip(xs, ys, strict=False)) if p != q),
                                   min(len(xs), len(ys))))
    return {"identical": same, "of": len(pairs), "rate": same / len(pairs),
            "first_divergence_word_median": statistics.median(divergence) if divergence else None}


def _greedy(figs: dict[str, dict[int, dict[str, Any]]], arms: list[str]) -> dict[str, Any]:
    """Identity rate of each arm against the baseline (same repetition), and the A/A rate it is judged against."""
    def rate(arm_a: str, arm_b: str, shift: int = 0) -> dict[str, Any] | None:
        hits = of = 0
        for rep, fa in figs.get(arm_a, {}).items():
            fb = figs.get(arm_b, {}).get(rep + shift)
            r = _identity(fa.get("greedy_texts"), fb.get("greedy_texts") if fb else None)
            if r is not None:
                hits, of = hits + r["identical"], of + r["of"]
        return {"identical": hits, "of": of, "rate": hits / of} if of else None

    aa = rate(BASELINE, CONTROL) if CONTROL in arms else rate(BASELINE, BASELINE, shift=1)
    restarted = all(f.get("greedy_after_restart") for by in figs.values() for f in by.values())
    source = ("control vs baseline" if CONTROL in arms else "baseline vs its next repetition "
              + ("(restart to restart)" if restarted else "(no restart between them)"))
    out: dict[str, Any] = {"aa": aa, "aa_source": source, "after_restart": restarted,
                           "note": None if restarted else "greedy sets did not follow a restart: a warm prefix cache "
                           "can flip near-tie tokens, so identity here is weaker evidence"}
    for arm in arms:
        if arm in (BASELINE, CONTROL):
            continue
        r = rate(arm, BASELINE)
        judged = None
        if r is not None and aa is not None:
            judged = "no worse than A/A" if r["rate"] >= aa["rate"] - 1.0 / max(aa["of"], 1) else "below A/A"
        out[arm] = {"vs_baseline": r, "judged": judged}
    return out


def _recommendation(levels: list[int], ivs: list[Interval], caps: dict[str, float | None],
                    hybrid: dict[str, Any] | None) -> dict[str, Any]:
    bands: list[dict[str, Any]] = [{"concurrency": c, "band": band_of(iv), **iv.to_json()}
                                   for c, iv in zip(levels, ivs, strict=True)]
    on = [c for c, iv in zip(levels, ivs, strict=True) if band_of(iv) == "on"]
    off = [c for c, iv in zip(levels, ivs, strict=True) if band_of(iv) == "off"]
    parts = []
    if on:
        parts.append(f"draft ON up to {max(on)} concurrent requests (its throughput interval is above the "
                     "baseline's there)")
    if off:
        parts.append(f"draft OFF from {min(off)} concurrent requests (its interval is below the baseline's)")
    undecided = [b["concurrency"] for b in bands if b["band"] == "either"]
    if undecided:
        parts.append(f"undecided at {', '.join(map(str, undecided))} (the interval straddles 1; more runs narrow it)")
    cap_c, cap_b = caps.get(CANDIDATE), caps.get(BASELINE)
    if cap_c and cap_b and cap_c < cap_b:
        parts.append(f"running requests are capped at {cap_c:g} with the draft and {cap_b:g} without: above "
                     f"{cap_c:g} concurrent the draft arm queues")
    action = ("`sgl-seat tune draft REPORT --seat SEAT` writes draft.off_above from this crossover's lower bound, "
              "which the plan runs as the seat's engine's own policy (`plan --json`'s draft_policy says how: "
              "SGLang's --speculative-adaptive tiers, vLLM's num_speculative_tokens_per_batch_size; the hybrid arm "
              "gates it)")
    if hybrid is not None:
        action += f"; the hybrid arm's verdict here is {hybrid['verdict']}"
    return {"bands": bands, "text": "; ".join(parts) or "no sweep measured", "action": action}


def build_report(bd: BatteryDir) -> dict[str, Any]:
    """The versioned report of a battery directory (complete or not: missing cells are listed)."""
    plan = bd.read_plan()
    battery = Battery.model_validate(plan["battery"])
    arms: list[str] = list(plan["arms"])
    cells = bd.cells()
    slots = schedule(arms, battery.runs)
    levels = battery.levels()
    figs: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    missing = [f"{s.key}/{c}" for s in slots for c in cell_names(levels) if (s.key, c) not in cells]
    for s in slots:
        if any(k == s.key for k, _ in cells):
            figs[s.arm][s.rep] = _arm_figures(battery, cells, s.key)
    synthetic = any(f["synthetic"] for by_rep in figs.values() for f in by_rep.values())

    floor: dict[str, Any] = {}
    if CONTROL in arms:
        keys = [(g.metric, g.at) for g in battery.gates if g.metric != "hangs"]
        keys += [("sweep_output_tok_s", c) for c in levels] + [("single_stream_tok_s", None)]
        for metric, at in dict.fromkeys(keys):
            iv = _interval(*_pairs(figs, CONTROL, metric, at))
            if iv is not None:
                floor[metric if at is None else f"{metric}@{at}"] = {
                    **iv.to_json(), "half_width": None if math.isinf(iv.half_width) else round(iv.half_width, 6)}

    comparisons: dict[str, Any] = {}
    for arm in arms:
        if arm == BASELINE:
            continue
        gates = [_gate(rule, figs, arm, floor) for rule in battery.gates]
        sweep = []
        for c in levels:
            iv = _interval(*_pairs(figs, arm, "sweep_output_tok_s", c))
            sweep.append({"concurrency": c, **(iv.to_json() if iv else {"ratio": None})})
        ss = _interval(*_pairs(figs, arm, "single_stream_tok_s"))
        comparisons[arm] = {"verdict": _verdict(gates), "gates": gates, "sweep": sweep,
                            "single_stream": {**(ss.to_json() if ss else {"ratio": None}), "gated": False}}

    # The verdict is the candidate's; without one (an A/A rehearsal), the control's: see the module docstring.
    subject = next((a for a in (CANDIDATE, HYBRID, CONTROL) if a in comparisons), CANDIDATE)
    judged = comparisons.get(subject, {})
    cand = comparisons.get(CANDIDATE, {})
    ivs = [_interval(*_pairs(figs, CANDIDATE, "sweep_output_tok_s", c)) for c in levels]
    cross = rec = None
    if cand and all(iv is not None for iv in ivs):
        good = [iv for iv in ivs if iv is not None]
        cross = crossover(levels, good).to_json()
        caps = {arm: statistics.median(v) if (v := [f["max_running_requests"] for f in figs.get(arm, {}).values()
                                                     if f["max_running_requests"]]) else None
                for arm in arms}
        rec = _recommendation(levels, good, caps, comparisons.get(HYBRID))

    per_arm = {arm: {str(rep): {k: v for k, v in f.items() if k != "greedy_texts"} for rep, f in sorted(by.items())}
               for arm, by in figs.items()}
    lag = [c["loop_lag_ms_max"] for by in figs.values() for f in by.values()
           for c in (f.get("client") or {}).values() if c]
    cpu = [c["cpu_s_per_request"] for by in figs.values() for f in by.values()
           for c in (f.get("client") or {}).values() if c]
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": "sgl-seat gate report",
        "sgl_seat_version": __version__,
        "synthetic": synthetic,
        "synthetic_note": SYNTHETIC_NOTE if synthetic else None,
        "note": plan.get("note"),
        "verdict": judged.get("verdict", INCONCLUSIVE),
        "verdict_of": subject,
        "gates": judged.get("gates", []),
        "noise_floor": floor or None,
        "noise_floor_note": None if floor else "no control arm: no A/A noise floor (add control to --arms)",
        "crossover_concurrency": None if cross is None else cross["estimate"],
        "crossover": cross,
        "recommendation": rec,
        "single_stream": {arm: c["single_stream"] for arm, c in comparisons.items()},
        "comparisons": comparisons,
        "greedy_identity": _greedy(figs, arms),
        "arms": per_arm,
        "client_overhead": {"loop_lag_ms_max": max(lag) if lag else None,
                            "cpu_s_per_request_max": max(cpu) if cpu else None},
        "design": {"arms": arms, "runs": battery.runs, "order": [s.key for s in slots], "levels": levels,
                   "battery": plan["battery"], "arms_from": plan.get("arms_from")},
        "complete": not missing,
        "missing_cells": missing,
    }
