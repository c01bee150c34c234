#!/usr/bin/env python3
"""`sgl-seat plan` wall time with SGLang's own sizing code vs the mirror, side by side.

Each run is a fresh ``sgl-seat plan --seat <seat> --draft on --json`` process (what an operator pays), once
with ``SGLSEAT_SIZING=sglang`` (the child process importing SGLang 0.5.23 and running its sizing) and once
with ``SGLSEAT_SIZING=mirror``. Printed: the median and worst of ``--runs`` runs for each, their ratio, and the
KV pool tokens each reported (they must agree within 1 %). Targets from issue 10: SGLang under 10 s, the
mirror under 0.5 s of plan time; the mirror's figure is measured in-process too (``build_plan`` alone, no
interpreter start). The SGLang path is measured cold (``SGLSEAT_SIZING_CACHE=off``: the child imports SGLang
and runs its sizing, what the first plan of a seat pays) and warm (the same plan again: SGLang's answers for
the identical inputs read back from the sizing cache, sgl_seat/sizing/cache.py), in a temporary
``SGLSEAT_HOME`` so no earlier cache entry counts.

Usage::

    python bench/plan_speed.py [--seat large] [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _plan_process(seat: str, source: str, *, cache: str = "off") -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "SGLSEAT_SIZING": source, "SGLSEAT_SIZING_CACHE": cache}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", "plan", "--seat", seat, "--draft", "on",
                           "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"plan failed ({source}): {proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def _in_process_mirror(seat: str, runs: int) -> list[float]:
    os.environ["SGLSEAT_SIZING"] = "mirror"
    from sgl_seat.plan import build_plan
    from sgl_seat.spec import load_spec

    spec = load_spec(seat)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        build_plan(spec, draft=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seat", default="large")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows: dict[str, Any] = {}
    os.environ["SGLSEAT_HOME"] = tempfile.mkdtemp(prefix="plan-speed-")
    _plan_process(args.seat, "sglang", cache="on")  # fills the cache for the warm rows
    for key, source, cache in (("sglang", "sglang", "off"), ("sglang_cached", "sglang", "on"),
                               ("mirror", "mirror", "off")):
        walls, tokens, label, notes = [], None, None, []
        for _ in range(args.runs):
            wall, doc = _plan_process(args.seat, source, cache=cache)
            walls.append(wall)
            cap = doc["capacity"]
            tokens, label = (cap["draft_off"]["kv_pool_tokens"], cap["draft_on"]["kv_pool_tokens"]), cap["source"]
            notes = [n for n in cap["notes"] if "sizing cache" in n]
        if (key == "sglang_cached") != bool(notes):
            raise SystemExit(f"{key}: expected {'a' if key == 'sglang_cached' else 'no'} cache note, got {notes}")
        rows[key] = {"median_s": statistics.median(walls), "max_s": max(walls), "source": label,
                     "tokens_off_on": tokens}
    shutil.rmtree(os.environ["SGLSEAT_HOME"], ignore_errors=True)
    inproc = _in_process_mirror(args.seat, max(args.runs, 5))
    rows["mirror_build_plan_only"] = {"median_s": statistics.median(inproc), "max_s": max(inproc)}
    s, m = rows["sglang"], rows["mirror"]
    agree = all(abs(a - b) <= 0.01 * max(a, 1) for a, b in zip(s["tokens_off_on"], m["tokens_off_on"], strict=True))
    agree = agree and rows["sglang_cached"]["tokens_off_on"] == s["tokens_off_on"]
    rows["ratio_sglang_over_mirror"] = s["median_s"] / m["median_s"]
    rows["tokens_agree_within_1pct"] = agree
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0 if agree else 1
    print(f"sgl-seat plan --seat {args.seat} --draft on --json, {args.runs} fresh processes each")
    print(f"  {'':32}{'median':>10}{'worst':>10}   source          KV pool off / on")
    names = {"sglang": "sglang, cold", "sglang_cached": "sglang, cache hit", "mirror": "mirror"}
    for key in ("sglang", "sglang_cached", "mirror"):
        r = rows[key]
        off, on = r["tokens_off_on"]
        print(f"  {names[key] + ' (whole process)':<32}{r['median_s']:>9.2f}s{r['max_s']:>9.2f}s   {r['source']:<15} "
              f"{off:,} / {on:,}")
    r = rows["mirror_build_plan_only"]
    print(f"  {'mirror (build_plan in-process)':<32}{r['median_s']:>9.3f}s{r['max_s']:>9.3f}s")
    print(f"  SGLang cold / mirror (whole process): {rows['ratio_sglang_over_mirror']:.1f}x; "
          f"pools agree within 1 % (cache hit identical): {'yes' if agree else 'NO'}")
    print(f"  load average at the end: {os.getloadavg()[0]:.2f} (figures inflate on a loaded machine)")
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
