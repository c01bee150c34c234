#!/usr/bin/env python3
"""Link down -> bundle, as a distribution (issue 24, item 2): the two-namespace cluster, one cut per run.

Each run brings a fresh seat up on the two-host cluster of tests/integration (two network namespaces on a bridge,
a raylet each, token auth on; the sim engine, draft on), runs traffic through node 0's host, and cuts the link of
node 1's host (``ip link set <bridge side> down``). Node 0's host alternates between the two hosts, so half the
runs cut the host that also holds the Ray head and the driver, half a plain worker. For each run, measured in this
one run from the moment of the cut (``time.time()`` just after ``ip link`` returned):

- node 0's bundle (the healthy side, ``node-unreachable`` of node 1): its manifest's ``trigger.t`` (the sidecar's
  detection: its heartbeats unanswered for ``SILENT_S``), its ``created`` (written), and when this script saw it
  complete on disk (polled every 0.05 s);
- node 1's own bundle (``node-isolated``, from its interface's carrier): the same three.

It prints each run, then p50 / p95 / max of each, and how many of node 0's bundles were written within 5 s (the
issue's target). The engine is the sim (synthetic figures for its serving); the cluster, the heartbeats, the link,
the sidecars and the bundles are real. Needs root (network namespaces), as the integration tests do.

    python bench/link_loss.py --runs 10 --out bench/results/link_loss_netns.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rigs.netns import (  # noqa: E402  (the integration tests' cluster: one implementation of it)
    NetnsCluster,
    cannot_run,
    seat_bundles,
    seat_spec,
    start,
    stop,
    under_traffic,
)

HTTP_PORT = 31410  # the seat's port block (31410-31426), clear of the integration test's 31210
TARGET_S = 5.0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def one_run(cl: NetnsCluster, i: int, work: Path) -> dict[str, Any]:
    pin = "b" if i % 2 == 0 else "a"
    home = work / f"home{i}"
    spec = seat_spec(cl, work / f"seat{i}.yaml", pin_node0=pin, http_port=HTTP_PORT)
    t0 = time.monotonic()
    up = cl.run_cli(["up", "--seat", str(spec), "--timeout", "180"], home, timeout=240)
    up_s = time.monotonic() - t0
    out: dict[str, Any] = {"run": i, "node0_host": pin, "up_s": up_s}
    try:
        if up.returncode != 0:
            out["error"] = f"up failed: {(up.stdout + up.stderr)[-800:]}"
            return out
        rec = json.loads((home / "seats" / "netns-sim.json").read_text())
        hosts = {int(n["node_rank"]): str(n["host"]) for n in rec["nodes"]}
        bundles = Path(rec["bundles_dir"])
        link = cl.link_of(hosts[1])
        seen: dict[int, tuple[dict[str, Any], float]] = {}
        with under_traffic(cl, hosts[0], HTTP_PORT):
            subprocess.run(["ip", "link", "set", link, "down"], check=True, timeout=10)
            t_down = time.time()
            try:
                while time.time() - t_down < 30 and len(seen) < 2:
                    for b in seat_bundles(bundles):
                        if len(b["nodes"]) == 1 and b["nodes"][0] not in seen:
                            seen[b["nodes"][0]] = (b, time.time() - t_down)
                    time.sleep(0.05)
            finally:
                subprocess.run(["ip", "link", "set", link, "up"], check=True, timeout=10)
        for n, (b, saw) in seen.items():
            v = b.get("verdict") or {}
            out[f"node{n}"] = {"kind": v.get("kind"), "names": v.get("node"), "seen_s": saw,
                               "detected_s": float(b["trigger"]["t"]) - t_down,
                               "written_s": float(b["created"]) - t_down}
        return out
    finally:
        t1 = time.monotonic()
        cl.run_cli(["down", "netns-sim"], home, timeout=120)
        out["down_s"] = time.monotonic() - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args()
    why = cannot_run()
    if why:
        print(f"cannot run: {why}")
        return 2
    prefix = f"sb{os.getpid() % 100000}"
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="link-loss-") as tmp:
        cl = start(prefix, Path(f"/tmp/{prefix}"))
        try:
            say(f"# link down -> bundle, two-namespace cluster, {args.runs} runs, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores")
            say("run node0@ up_s | node 0 (healthy): kind names detected written seen | "
                "node 1 (cut): kind names detected written seen")
            for i in range(args.runs):
                r = one_run(cl, i, Path(tmp))
                runs.append(r)
                if "error" in r:
                    say(f"{i:3d} {r['node0_host']} ERROR {r['error']}")
                    continue
                cols = []
                for n in (0, 1):
                    d = r.get(f"node{n}")
                    cols.append("no bundle within 30 s" if d is None else
                                f"{d['kind']} {d['names']} {d['detected_s']:.2f} {d['written_s']:.2f} "
                                f"{d['seen_s']:.2f}")
                say(f"{i:3d} {r['node0_host']:>6} {r['up_s']:5.1f} | {cols[0]} | {cols[1]}")
        finally:
            left = stop(cl)
            if left:
                say(f"cluster removal: {left}")
    say("")
    for n, what in ((0, "node 0's bundle (node-unreachable of node 1)"), (1, "node 1's own bundle (node-isolated)")):
        ds = [r[f"node{n}"] for r in runs if f"node{n}" in r]
        if not ds:
            say(f"{what}: none")
            continue
        for key in ("detected_s", "written_s", "seen_s"):
            xs = [d[key] for d in ds]
            say(f"{what} {key[:-2]:>8}: p50 {statistics.median(xs):.2f} s  p95 {_pct(xs, 0.95):.2f} s  "
                f"max {max(xs):.2f} s  (n={len(xs)})")
        right = sum(1 for d in ds if d["names"] == 1 and d["kind"] == ("node-unreachable" if n == 0 else
                                                                         "node-isolated"))
        say(f"{what}: right kind and node in {right} of {len(runs)} runs")
    w0 = [r["node0"]["written_s"] for r in runs if "node0" in r]
    say(f"node 0's bundle written within {TARGET_S:g} s of the cut: {sum(1 for x in w0 if x <= TARGET_S)} of "
        f"{len(runs)} runs")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
