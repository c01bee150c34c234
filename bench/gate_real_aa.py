#!/usr/bin/env python3
"""The gate against the real engine: an A/A comparison of one real SGLang seat against itself.

Brings the ``local-sglang`` rehearsal seat up (SGLang 0.5.23's CPU engine, TP2 over two local nodes, a tiny model
with random weights; the draft is off: the CPU engine runs none), then runs ``sgl-seat gate --url`` with every arm
(baseline, candidate, control) pointed at that one seat and the battery sized for it
(``launch/workloads/cpu-rehearsal.yaml``), and takes it down. Every ratio is then the real engine's run-to-run
noise on 2 cores: the report's A/A floor per metric, and what the ship rule made of identical arms (a sound rule
says INCONCLUSIVE or PASS, never FAIL). Prints the gate's own text report, then the noise floor per metric.
Ports 24480-24499. Usage::

    python bench/gate_real_aa.py [--quick] [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
HTTP_PORT, DIST_PORT = 24480, 24485
NAME = "gate-aa"
WORKLOADS = REPO / "launch" / "workloads" / "cpu-rehearsal.yaml"


def cli(args: list[str], home: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGLSEAT_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    return subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the battery's quick block (fewer runs and levels)")
    ap.add_argument("--runs", type=int, default=None, help="repetitions per arm (default: the battery's)")
    ap.add_argument("--json", action="store_true", help="also print the gate's JSON report")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sgl-seat-gate-aa-"))
    home = work / "home"
    doc: dict[str, Any] = yaml.safe_load((REPO / "launch" / "seats" / "local-sglang.yaml").read_text())
    doc["name"] = NAME
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = HTTP_PORT, DIST_PORT
    spec = work / f"{NAME}.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    up = cli(["up", "--seat", str(spec), "--timeout", "600"], home, timeout=700)
    if up.returncode != 0:
        print(up.stdout, up.stderr, file=sys.stderr)
        cli(["down", NAME], home, timeout=240)
        return 1
    url = f"http://127.0.0.1:{HTTP_PORT}"
    try:
        args = ["gate", "--url", f"baseline={url}", "--url", f"candidate={url}", "--url", f"control={url}",
                "--arms", "baseline,candidate,control", "--workloads", str(WORKLOADS), "--out", str(work / "battery"),
                "--json"]
        if a.quick:
            args.append("--quick")
        if a.runs:
            args += ["--runs", str(a.runs)]
        res = cli(args, home, timeout=3600)
        print(res.stderr[-4000:], file=sys.stderr)
        if res.returncode not in (0, 1, 3) or not res.stdout.strip().startswith("{"):
            print(f"gate failed (exit {res.returncode}):\n{res.stdout[-2000:]}", file=sys.stderr)
            return 1
        rep = json.loads(res.stdout)
    finally:
        cli(["down", NAME], home, timeout=240)
    from sgl_seat.gate.report_text import render_text

    print("A/A on real SGLang 0.5.23 (CPU engine, tiny model, TP2 on two local nodes, 2 cores): every arm is the same"
          " seat, so every ratio is run-to-run noise")
    sys.stdout.write(render_text(rep))
    print("\nA/A noise floor per metric (control / baseline, paired log-ratio 95 % interval):")
    for key, nf in sorted((rep.get("noise_floor") or {}).items()):
        print(f"  {key:<34} {json.dumps(nf)}")
    if a.json:
        print(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
