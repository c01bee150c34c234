"""The report's next step on real SGLang 0.5.17 on one H200: the gate's arms, the crossover, the policy, the plan.

Each step through the product's own commands:

1. ``sgl-seat gate --seat h200-1 --arms baseline,candidate,hybrid,control`` with ``bench/gpu/gate-workloads.yaml``
   (2 runs, ABBA, the A/A control): every slot brings its arm up cold through Ray and the engine package (draft
   off; the static EAGLE draft; the hybrid: the same draft under ``draft.off_above`` (``--hybrid-off-above``,
   default 4: set for the battery, between the sweep's first two levels, as the seat has no policy before its first
   gate; SGLang's default tiers crashed 0.5.17 on this image); the baseline again), measures it and takes it
   down. The report (JSON, text, HTML) holds the verdict, the crossover and its interval, the hybrid's verdict,
   each arm's accept length, KV pool and slot cap.
2. ``sgl-seat tune draft REPORT --seat COPY``: the policy from the crossover's lower bound, or the refusal and why.
3. ``sgl-seat plan --seat COPY --draft on --json``: the adaptive flags and tier file the policy became, and what
   the hybrid keeps.

Without ``--trained`` THE MODEL IS RANDOM WEIGHTS (``--load-format dummy``): an 8B-shaped Llama (hidden 4096, 32
layers, 8 KV heads, vocabulary 1024) and a random one-layer EAGLE head, whose drafts are (almost) never accepted.
With ``--trained DIR --eagle-head HEAD`` the model is the trained SmolLM2-135M-Instruct (converted by
``trainedmodel.py ensure``) and the draft the EAGLE-1 head ``sgl_seat/engines/eaglehead.py`` trained from the model's
own answers (SGLang's flavour): the only trained draft the hybrid can run (SGLang's adaptive tiers take EAGLE with
topk 1), on users' chat requests sampled as they are served (``bench/gpu/gate-workloads-trained.yaml``). Every
figure names the model it came from. The spec copy takes the GPU's memory as measured here (draft_seat.gpu_facts).

    python bench/gpu/gate_seat.py --engine-venv ENG --out DIR [--home DIR] [--resume]
        [--trained DIR --eagle-head HEAD] [--workloads FILE] [--arms A,B,...] [--hybrid-off-above N]

Run by the image's Python with the seat package and this checkout on PYTHONPATH (docs/gpu-validation.md); it is
long (about 17 minutes), so the device call starts it with setsid and later calls read DIR/progress.log. Writes
DIR/gate_seat.json, DIR/battery/ (cells and report.json), DIR/gate.html, DIR/gate.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import draft_seat  # a sibling script: the memory facts, the spec copy, the models, the CLI runner)

REPO = draft_seat.REPO
ARMS = "baseline,candidate,hybrid"  # the control (A/A) too where the device time allows: --arms
MODEL_NOTE = ("RANDOM WEIGHTS (--load-format dummy): 8B-shaped Llama, hidden 4096, 32 layers, vocabulary 1024; "
              "a random 1-layer EAGLE head (drafts almost never accepted); one H200, SGLang 0.5.17")


def trained_note(head: Path, facts: dict[str, Any]) -> str:
    """What the battery's figures come from, when the model is the trained one: the model, the draft, the GPU."""
    from sgl_seat.engines import trainedmodel

    return (f"TRAINED: {trainedmodel.TITLE} (bf16); draft: the EAGLE-1 head eaglehead.py trained from the model's own "
            f"answers ({head.name}, 3 steps, topk 1, 4 draft tokens); {facts.get('device') or 'one GPU'}, "
            "SGLang 0.5.17")


def per_arm(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's medians over its runs: pool, slot cap, accept length, single stream, throughput by level."""
    out: dict[str, dict[str, Any]] = {}
    for arm, runs in (rep.get("arms") or {}).items():
        figs = list(runs.values())

        def med(key: str, figs: list[dict[str, Any]] = figs) -> float | None:
            vals = [f[key] for f in figs if isinstance(f.get(key), int | float)]
            return round(statistics.median(vals), 3) if vals else None

        levels = sorted({int(c) for f in figs for c in (f.get("sweep_output_tok_s") or {})})
        out[arm] = {"kv_pool_tokens": med("kv_pool_tokens"), "max_running_requests": med("max_running_requests"),
                    "accept_length": med("accept_length"), "single_stream_tok_s": med("single_stream_tok_s"),
                    "cold_ttft_s": med("cold_ttft_s"), "up_s": med("up_s"),
                    "speculative_adaptive": figs[0].get("speculative_adaptive") if figs else None,
                    "output_tok_s": {c: round(statistics.median(
                        [v for f in figs if (v := (f.get("sweep_output_tok_s") or {}).get(str(c),
                                                  (f.get("sweep_output_tok_s") or {}).get(c))) is not None]), 1)
                        for c in levels}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--engine-venv", required=True, help="the laid-out engine package (hostlayout.py DEST)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--home", type=Path, default=Path("/tmp/sgl-seat-home"))
    ap.add_argument("--resume", action="store_true", help="continue the battery in OUT/battery")
    ap.add_argument("--arms", default=ARMS, help=f"the gate's --arms (default {ARMS})")
    ap.add_argument("--hybrid-off-above", type=int, default=4, help="the hybrid arm's draft.off_above")
    ap.add_argument("--trained", type=Path, help="the trained model's directory on this host (trainedmodel.py's)")
    ap.add_argument("--eagle-head", type=Path, help="with --trained: eaglehead.py's head for SGLang (its sglang/)")
    ap.add_argument("--workloads", type=Path, help="the battery's workloads file (default: gate-workloads.yaml, or "
                    "gate-workloads-trained.yaml with --trained)")
    ns = ap.parse_args()
    if ns.trained is not None and ns.eagle_head is None:
        ap.error("--trained needs --eagle-head: the hybrid runs an EAGLE draft (SGLang's adaptive tiers)")
    ns.out.mkdir(parents=True, exist_ok=True)
    eng = Path(ns.engine_venv).resolve()
    env = dict(os.environ, SGLSEAT_HOME=str(ns.home), SGLSEAT_ENGINE_VENV=str(eng),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="200")
    facts = draft_seat.gpu_facts(str(eng / "bin" / "python"))
    model_note = MODEL_NOTE if ns.trained is None else trained_note(ns.eagle_head, facts)
    doc: dict[str, Any] = {"model": model_note, "started": time.time(), "gpu_facts": facts}
    if ns.eagle_head is not None:
        doc["eagle_head"] = json.loads((ns.eagle_head / "sgl-seat-eagle-head.json").read_text())
    spec = ns.out / "h200-1-eagle.yaml"
    if not spec.is_file():  # a resumed run keeps its spec copy (and the policy tune may have written into it)
        draft_seat.write_spec("eagle", facts, ns.out, trained=ns.trained, eagle_head=ns.eagle_head)
        seat = yaml.safe_load(spec.read_text())
        seat["name"] = "h200-gate"
        # The hybrid arm's policy, set for this battery (the seat has none before its first gate): low in the sweep,
        # so the battery sees the hybrid drafting and not (the default 4: drafting at 1 request and not at 8, 32, 64
        # in gate-workloads.yaml; at 1 and 4 and not at 16, 64 in gate-workloads-trained.yaml). SGLang's default
        # tiers are not used: on this image 0.5.17 crashed capturing their 7-step state's graphs (run 1).
        seat["draft"]["off_above"] = ns.hybrid_off_above
        spec.write_text(yaml.safe_dump(seat, sort_keys=False))
    for m in draft_seat.MODELS[:2] if ns.trained is None else ():
        if not (eng / "models" / m / "config.json").is_file():
            made = draft_seat.cli(["model", "tiny", str(eng / "models" / m), "--config",
                                   str(REPO / "launch" / "models" / m)], env, 300)
            doc.setdefault("model_errors", []).append(made) if made["rc"] else None
    battery = ns.out / "battery"
    args = ["gate", "--seat", str(spec), "--json", "--html", str(ns.out / "gate.html"), "--note", model_note]
    workloads = ns.workloads or REPO / "bench" / "gpu" / ("gate-workloads.yaml" if ns.trained is None else
                                                          "gate-workloads-trained.yaml")
    args += (["--resume", str(battery)] if ns.resume and battery.is_dir() else
             ["--arms", ns.arms, "--workloads", str(workloads), "--out", str(battery)])
    t0 = time.monotonic()
    with (ns.out / "progress.log").open("a") as log:
        log.write(f"gate: {' '.join(args)}\n")
        log.flush()
        p = subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, stdout=subprocess.PIPE,
                           stderr=log, text=True, timeout=3600, check=False, cwd=str(REPO))
    doc["gate"] = {"rc": p.returncode, "s": round(time.monotonic() - t0, 1)}
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = None
        doc["gate"]["stdout"] = p.stdout[-4000:]
    if rep is not None and "design" not in rep:  # the gate's --json error document, not a report
        doc["gate"]["error"], rep = rep, None
    if rep is not None:
        from sgl_seat.gate.report_text import render_text

        (ns.out / "gate.txt").write_text(render_text(rep))
        doc["verdict"] = {"verdict": rep["verdict"], "verdict_of": rep["verdict_of"],
                          "hybrid": rep["comparisons"].get("hybrid", {}).get("verdict"),
                          "crossover": rep["crossover"], "recommendation": rep["recommendation"],
                          "gates": {g["name"]: {k: g.get(k) for k in ("ratio", "ci_low", "ci_high", "outcome")}
                                    for g in rep["gates"]},
                          "hybrid_gates": {g["name"]: {k: g.get(k) for k in ("ratio", "ci_low", "ci_high", "outcome")}
                                           for g in rep["comparisons"].get("hybrid", {}).get("gates", [])},
                          "sweep": {a: rep["comparisons"][a]["sweep"] for a in rep["comparisons"]},
                          "single_stream": rep["single_stream"]}
        doc["arms"] = per_arm(rep)
    tune = draft_seat.cli(["tune", "draft", str(battery), "--seat", str(spec), "--json"], env, 120)
    doc["tune"] = {"rc": tune["rc"], "result": draft_seat.as_json(tune), "stderr": tune["stderr"][-2000:]}
    plan = draft_seat.as_json(draft_seat.cli(["plan", "--seat", str(spec), "--draft", "on", "--json"], env, 300))
    plan = plan or {}
    doc["plan_after_tune"] = {"draft_policy": plan.get("draft_policy"), "warnings": plan.get("warnings"),
                              "command": (plan.get("nodes") or [{}])[0].get("command")}
    doc["finished"] = time.time()
    (ns.out / "gate_seat.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nthe gate on {facts.get('device') or 'the GPU'} ({model_note}):")
    print(json.dumps(doc.get("verdict", {}).get("crossover")), doc.get("verdict", {}).get("verdict"),
          "hybrid:", doc.get("verdict", {}).get("hybrid"))
    for arm, f in (doc.get("arms") or {}).items():
        print(f"{arm:<10} pool {f['kv_pool_tokens']} slots {f['max_running_requests']} accept {f['accept_length']} "
              f"single {f['single_stream_tok_s']} tok/s by level {f['output_tok_s']}")
    print("tune:", tune["rc"], (doc["tune"]["result"] or {}).get("off_above"), tune["stderr"][-400:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
