#!/usr/bin/env python3
"""Two local Ray clusters side by side: N `up`/`down` pairs on each of two sides at once, each `up` starting its own
local Ray cluster (``cluster.address: local``: the holder in sgl_seat/launch/host/localcluster.py), with its own ports
and its own ``SGLSEAT_HOME``.

Why: the test command runs the real-engine stream (local Ray clusters of its own) beside the sim seats' stream
(tests/integration/conftest.py). Two local clusters on one host share nothing by design (each head takes a free GCS
port, Ray's other ports are picked free, each session has its own directory under /tmp/ray), and this bench is the
proof that holds the test layout to it: every pair must come up READY and go down within its timeout on both sides
while the other side does the same, and no process of either side may be left.

    python bench/ray_side_by_side.py [--pairs 10] [--timeout 240] [--port-a 28400] [--port-b 28500] [--json]

Prints each side's up and down times (min / median / max) and the failures, and the ratio of the median up side
by side to the median up of a lone run measured first in the same process run (``--alone 2`` pairs on side a).
The ports are below Linux's ephemeral range (32768-60999), where an outgoing connection can take a fixed port at
any moment (a first run on 33400/33500 lost 33512 that way: three `up`s of side b refused by preflight).
The engines are the sim's: figures are synthetic as engines, real as Ray and sgl-seat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
LOCAL_SIM = REPO / "launch" / "seats" / "local-sim.yaml"


@dataclass
class Side:
    name: str
    port: int
    home: Path
    spec: Path
    ups: list[float] = field(default_factory=list)
    downs: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _spec(work: Path, name: str, port: int) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    doc["name"] = name
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = port, port + 5
    doc["model"]["config"] = str((LOCAL_SIM.parent / doc["model"]["config"]).resolve())
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cli(args: list[str], home: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "sgl-seat"
    env = {**os.environ, "SGLSEAT_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "NO_COLOR": "1"}
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _pairs(side: Side, n: int, timeout: float) -> None:
    for i in range(n):
        t0 = time.monotonic()
        try:
            up = _cli(["up", "--seat", str(side.spec), "--timeout", str(timeout)], side.home, timeout + 60)
            ok = up.returncode == 0
            why = "" if ok else f"up #{i} exit {up.returncode}: {(up.stderr or up.stdout).strip()[-400:]}"
        except subprocess.TimeoutExpired:
            ok, why = False, f"up #{i} did not return within {timeout + 60:.0f} s"
        t1 = time.monotonic()
        if ok:
            side.ups.append(t1 - t0)
        else:
            side.failures.append(why)
        try:
            down = _cli(["down", side.spec.stem], side.home, 180)
            if down.returncode != 0:
                side.failures.append(f"down #{i} exit {down.returncode}: {(down.stderr or down.stdout).strip()[-400:]}")
        except subprocess.TimeoutExpired:
            side.failures.append(f"down #{i} did not return within 180 s")
        side.downs.append(time.monotonic() - t1)
        print(f"[{side.name}] pair {i + 1}/{n}: up {'%.1f s' % (t1 - t0) if ok else 'FAILED'}, "
              f"down {side.downs[-1]:.1f} s", file=sys.stderr, flush=True)


def _left(names: set[str]) -> list[int]:
    """Processes of either side's seats still alive (the engines carry SGLSEAT_NAME in their environment)."""
    from sgl_seat import envcompat

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if envcompat.lookup(p.environ(), "SGLSEAT_NAME") in names:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _stats(xs: list[float]) -> str:
    if not xs:
        return "none"
    return f"{min(xs):.1f} / {statistics.median(xs):.1f} / {max(xs):.1f} s (n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=10, help="up/down pairs on each side (default 10: 20 in all)")
    ap.add_argument("--alone", type=int, default=2, help="pairs on side a alone first, for the ratio (0: none)")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--port-a", type=int, default=28400)
    ap.add_argument("--port-b", type=int, default=28500)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sgl-seat-sbs-") as tmp:
        work = Path(tmp)
        lone = Side("alone", a.port_a, work / "home-alone", _spec(work, "sbs-alone", a.port_a))
        sides = [Side(n, p, work / f"home-{n}", _spec(work, f"sbs-{n}", p)) for n, p in (("a", a.port_a),
                                                                                        ("b", a.port_b))]
        if a.alone:
            _pairs(lone, a.alone, a.timeout)
        t0 = time.monotonic()
        threads = [threading.Thread(target=_pairs, args=(s, a.pairs, a.timeout)) for s in sides]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        left = _left({"sbs-alone", "sbs-a", "sbs-b"})
    med_alone = statistics.median(lone.ups) if lone.ups else None
    med_sbs = statistics.median([x for s in sides for x in s.ups]) if any(s.ups for s in sides) else None
    doc = {
        "pairs_per_side": a.pairs, "wall_s": round(wall, 1), "left_processes": left,
        "alone": {"up": lone.ups, "down": lone.downs, "failures": lone.failures},
        "sides": {s.name: {"up": [round(x, 1) for x in s.ups], "down": [round(x, 1) for x in s.downs],
                           "failures": s.failures} for s in sides},
        "up_median_ratio_side_by_side_to_alone": round(med_sbs / med_alone, 2) if med_alone and med_sbs else None,
    }
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"two local Ray clusters side by side: {a.pairs} up/down pairs on each side, {wall:.0f} s wall")
        if a.alone:
            print(f"  alone first     up {_stats(lone.ups)}   down {_stats(lone.downs)}")
        for s in sides:
            print(f"  side {s.name}          up {_stats(s.ups)}   down {_stats(s.downs)}   failures {len(s.failures)}")
            for f in s.failures:
                print(f"    {f}")
        if doc["up_median_ratio_side_by_side_to_alone"] is not None:
            print(f"  up median side by side / alone: {doc['up_median_ratio_side_by_side_to_alone']:.2f}x")
        print(f"  processes left: {len(left)}")
    ok = not left and not any(s.failures for s in sides) and not lone.failures
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
