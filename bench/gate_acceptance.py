#!/usr/bin/env python3
"""Issue 14's acceptance on the local-sim seat, side by side in one run (every figure synthetic).

Cases (each a whole `sgl-seat gate` battery, arms brought up and down per slot through a local Ray cluster):

1. ``shape``: baseline, candidate, hybrid and control with the shipped workloads; expected from the field report:
   single-stream up, aggregate_at_64 FAIL, DO_NOT_SHIP, a crossover; the hybrid arm measured like the others.
2. ``free-draft``: the draft's costs zeroed in the sim (``SGLSEAT_SIM_DRAFT_COST=0``, a sim-only knob: no draft
   forwards, no extra prefill, no per-request KV look-ahead) and no KV cost in the plan (``draft.extra_weights_gb
   0`` and the draft-off slot count ``draft.slots = slots``); expected: aggregate_at_64 PASS. The draft's per-token
   KV cell stays in the planner's pool (SGLang folds it into every token), so kv_pool may still FAIL.
3. ``aa``: baseline against control (the baseline again), five batteries with seeds 1-5; expected: no gate FAILs.
4. ``tune``: the report's next step after ``shape``: ``sgl-seat tune draft`` writes ``draft.off_above`` into a copy
   of the seat from shape's crossover (or says why it cannot), ``plan --draft on`` turns it into SGLang's adaptive
   tiers, and a battery of baseline, hybrid and control gates the tuned seat (the verdict is the hybrid's).

``--quick`` (default) uses the workloads' quick block (2 runs, sweep 1/8/64); ``--full`` the full block (3 runs,
sweep 1-96: about an hour per case on 2 cores). The sim's step floor is the profile's 30 ms in every case: nothing is
tuned per case. Ports 30700-30799; ``SGLSEAT_HOME`` as set (default a temporary directory).

Usage::

    python bench/gate_acceptance.py [--full] [--cases shape,free-draft,aa] [--aa-seeds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from sgl_seat.gate import GateOptions, Progress, run_gate
from sgl_seat.gate.report_text import render_text
from sgl_seat.sim.args import ENV_DRAFT_COST
from sgl_seat.spec import SeatSpec, builtin_seats_dir, parse_spec

HTTP_PORT = 30700  # +2 admin, +5 dist-init, +10/+12 node 1, +15/+16 sidecar exporters


def _spec(name: str, *, free_draft: bool = False, write: Path | None = None) -> SeatSpec:
    """local-sim renamed onto the bench's ports (``write``: also as a seat file there, for `tune draft` to edit)."""
    src = builtin_seats_dir() / "local-sim.yaml"
    doc: dict[str, Any] = yaml.safe_load(src.read_text())
    doc["name"] = name
    doc["network"]["http_port"] = HTTP_PORT
    doc["network"]["dist_init_port"] = HTTP_PORT + 5
    if doc["model"].get("config"):
        doc["model"]["config"] = str((src.parent / doc["model"]["config"]).resolve())
    if free_draft:
        doc["network"].setdefault("env", {})[ENV_DRAFT_COST] = "0"
        doc["draft"]["extra_weights_gb"] = 0.0
        doc["draft"]["slots"] = doc["slots"]
    text = yaml.safe_dump(doc, sort_keys=False)
    if write is not None:
        write.write_text(text)
    return parse_spec(text, path=str(write or src))


def _progress(p: Progress) -> None:
    eta = "" if p.eta_s is None else f" (~{p.eta_s / 60:.1f} min left)"
    print(f"  [{time.strftime('%H:%M:%S')}] slot {min(p.done_slots + 1, p.total_slots)}/{p.total_slots} {p.slot} "
          f"{p.cell}{eta}", file=sys.stderr, flush=True)


def _run(label: str, spec: SeatSpec, arms: list[str], out: Path, *, quick: bool, seed: int | None = None,
         runs: int | None = None) -> dict[str, Any]:
    print(f"== {label}: arms {','.join(arms)} seed {seed}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    res = run_gate(GateOptions(spec=spec, arms=arms, quick=quick, seed=seed, runs=runs, out=out / label),
                   progress=_progress,
                   say=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    rep = res.report
    rep["bench_seconds"] = round(time.monotonic() - t0, 1)
    (out / f"{label}.txt").write_text(render_text(rep))
    return rep


def _gate(rep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in rep["gates"] if g["name"] == name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full workloads (3 runs, sweep to 96)")
    ap.add_argument("--cases", default="shape,free-draft,aa,tune")
    ap.add_argument("--aa-seeds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=None, help="runs per arm for the shape and free-draft cases")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("SGLSEAT_HOME", tempfile.mkdtemp(prefix="sgl-seat-gate-bench-"))
    out = a.out or Path(os.environ["SGLSEAT_HOME"]) / "gate-acceptance"
    out.mkdir(parents=True, exist_ok=True)
    quick = not a.full
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    rows: list[tuple[str, str, str]] = []
    results: dict[str, Any] = {"quick": quick, "synthetic": True}
    t0 = time.monotonic()
    if "shape" in cases:
        rep = _run("shape", _spec("gacc"), ["baseline", "candidate", "hybrid", "control"], out, quick=quick,
                   runs=a.runs)
        results["shape"] = rep
        ss, agg = rep["single_stream"]["candidate"], _gate(rep, "aggregate_at_64")
        hyb = rep["comparisons"]["hybrid"]
        rows += [
            ("shape: single-stream candidate/baseline", f"{ss['ratio']} [{ss['ci_low']}, {ss['ci_high']}]",
             "above 1" if (ss["ci_low"] or 0) > 1 else "NOT above 1"),
            ("shape: aggregate_at_64", f"{agg['ratio']} [{agg['ci_low']}, {agg['ci_high']}]", agg["outcome"]),
            ("shape: verdict", rep["verdict"], "as expected" if rep["verdict"] == "DO_NOT_SHIP" else "UNEXPECTED"),
            ("shape: crossover concurrency", str(rep["crossover"]), "reported" if rep["crossover"] else "missing"),
            ("shape: hybrid verdict", hyb["verdict"],
             ", ".join(f"{g['name']} {g['outcome']}" for g in hyb["gates"])),
            ("shape: control (A/A) gates", ", ".join(g["outcome"] for g in rep["comparisons"]["control"]["gates"]),
             "no FAIL" if all(g["outcome"] != "FAIL" for g in rep["comparisons"]["control"]["gates"]) else "FAIL"),
            ("shape: wall time", f"{rep['bench_seconds']} s", ""),
        ]
    if "tune" in cases:
        from sgl_seat.errors import TuneRefused
        from sgl_seat.gate.tune import tune_draft
        from sgl_seat.plan import build_plan
        from sgl_seat.spec import load_spec

        if "shape" not in results:
            results["shape"] = _run("shape", _spec("gacc"), ["baseline", "candidate", "hybrid", "control"], out,
                                    quick=quick, runs=a.runs)
        seat = out / "gtune.yaml"
        _spec("gtune", write=seat)
        try:
            t = tune_draft(out / "shape", str(seat))
        except TuneRefused as exc:
            rows.append(("tune: draft.off_above", "not written", str(exc).splitlines()[0]))
        else:
            spec = load_spec(str(seat))
            plan = build_plan(spec, draft=True)
            pol = plan.draft_policy or {}
            rows += [("tune: draft.off_above", str(t.off_above), t.why),
                     ("tune: plan's tiers", json.dumps(pol.get("config")), "; ".join(plan.warnings) or "")]
            rep = _run("tuned-hybrid", spec, ["baseline", "hybrid", "control"], out, quick=quick, runs=a.runs)
            results["tuned_hybrid"] = rep
            hyb = rep["comparisons"]["hybrid"]
            rows += [("tuned: hybrid verdict", f"{rep['verdict']} (verdict_of {rep['verdict_of']})",
                      ", ".join(f"{g['name']} {g['outcome']}" for g in hyb["gates"])),
                     ("tuned: hybrid/baseline by level", "; ".join(
                         f"c={x['concurrency']} {x['ratio']} [{x['ci_low']}, {x['ci_high']}]" for x in hyb["sweep"]),
                      f"single stream {hyb['single_stream'].get('ratio')}"),
                     ("tuned: wall time", f"{rep['bench_seconds']} s", "")]
    if "free-draft" in cases:
        rep = _run("free-draft", _spec("gfree", free_draft=True), ["baseline", "candidate"], out, quick=quick,
                   runs=a.runs)
        results["free_draft"] = rep
        agg = _gate(rep, "aggregate_at_64")
        rows += [("free draft: aggregate_at_64", f"{agg['ratio']} [{agg['ci_low']}, {agg['ci_high']}]",
                  agg["outcome"]),
                 ("free draft: all gates", ", ".join(f"{g['name']} {g['outcome']}" for g in rep["gates"]), ""),
                 ("free draft: wall time", f"{rep['bench_seconds']} s", "")]
    if "aa" in cases:
        fails = []
        for seed in range(1, a.aa_seeds + 1):
            rep = _run(f"aa-seed{seed}", _spec("gaa"), ["baseline", "control"], out, quick=quick, seed=seed)
            comp = rep["comparisons"]["control"]
            results[f"aa_seed{seed}"] = rep
            outs = {g["name"]: g["outcome"] for g in comp["gates"]}
            fails += [f"seed {seed}: {n}" for n, o in outs.items() if o == "FAIL"]
            rows.append((f"A/A seed {seed}", ", ".join(f"{n} {o}" for n, o in outs.items()),
                         f"{rep['bench_seconds']} s"))
        rows.append(("A/A over all seeds", "FAILs: " + (", ".join(fails) or "none"),
                     "as expected" if not fails else "UNEXPECTED"))
    results["wall_s"] = round(time.monotonic() - t0, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("SYNTHETIC: every figure below comes from sgl-seat's sim engine on this host, not from a GPU or SGLang.")
    print(f"workloads: {'quick' if quick else 'full'}; results in {out}")
    w = max(len(r[0]) for r in rows) if rows else 10
    for name, val, note in rows:
        print(f"{name:<{w}}  {val}  {note}")
    print(f"total wall time {results['wall_s']} s")
    if a.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
