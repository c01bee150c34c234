#!/usr/bin/env python3
"""What `sgl-seat up` and `sgl-seat down` spend their time on, stage by stage (median of N runs).

Runs the real library calls (``sgl_seat.launch.up.up`` / ``sgl_seat.launch.teardown.down``) on the
``local-sim`` profile: each run starts the background local Ray cluster of two simulated nodes, places the group, starts
the node agents, runs preflight, starts the sim engines, waits for READY, then takes everything
down and verifies. Stage times come from the same reporter the CLI prints. Everything runs on
127.0.0.1 under a temporary ``$SGLSEAT_HOME``; ports are the profile's unless ``--port`` moves them.
The engine is the sim: the engine stages measure sgl-seat's overhead plus the sim's start-up, not
SGLang's weight loading.

    python bench/up_overhead.py [--runs 3] [--draft on|off] [--seat local-sim] [--port 33900] [--json]
    python bench/up_overhead.py --seat local-sglang --runs 2     # real SGLang on its CPU engine (draft off)

The existing-cluster case (issue 11): ``--existing-cluster --seat SPEC`` with a spec whose ``cluster.address``
is a cluster you run (e.g. the two-namespace cluster of ``scripts/netns-cluster.sh``; run the bench on one of
its hosts: ``ip netns exec <prefix>-a``, with the token in the variable ``cluster.token_env`` names). The line
"up excluding engine start" is the total less the stages that wait for the engines (engine-node0, engines,
ready): what sgl-seat itself costs on a cluster that is already up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

# Before anything imports ray. Not for an existing multi-host cluster: there a driver must use its host's address.
if "--existing-cluster" not in sys.argv:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from sgl_seat.engines import backend_for
from sgl_seat.launch.stages import StageTimes
from sgl_seat.launch.teardown import down
from sgl_seat.launch.up import UpOptions, up
from sgl_seat.spec import SeatSpec, load_spec, parse_spec, resolve_seat_path


def _spec(seat: str, port: int | None, workdir: Path) -> SeatSpec:
    if port is None:
        return load_spec(seat)
    path = resolve_seat_path(seat)
    doc = yaml.safe_load(path.read_text())
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = port, port + 5
    cfg = doc.get("model", {}).get("config")
    if cfg and not Path(cfg).is_absolute():
        doc["model"]["config"] = str((path.parent / cfg).resolve())
    out = workdir / path.name
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return parse_spec(out.read_text(), path=str(out))


def _table(title: str, runs: list[StageTimes]) -> list[dict[str, object]]:
    """Print one table (stage x run, median, share of the median total); return its rows as JSON-able dicts."""
    names: list[str] = []
    for r in runs:
        names += [n for n, _ in r.stages if n not in names]
    table = [(n, [sum(s for m, s in r.stages if m == n) for r in runs]) for n in names]
    table.append(("total", [r.total() for r in runs]))
    med_total = statistics.median(table[-1][1]) or 1.0
    cols = "".join(f"{'run ' + str(i + 1):>9}" for i in range(len(runs)))
    head = f"{title:<14}{cols}{'median':>9}{'share':>8}"
    print(head)
    print("-" * len(head))
    rows: list[dict[str, object]] = []
    for name, vals in table:
        med = statistics.median(vals)
        print(f"{name:<14}" + "".join(f"{v:9.2f}" for v in vals) + f"{med:9.2f}{med / med_total:8.0%}")
        rows.append({"stage": name, "runs": vals, "median": med})
    print()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--draft", choices=["on", "off"], default=None,
                    help="default: on, unless the seat's engine cannot run the draft (local-sglang: off)")
    ap.add_argument("--seat", default="local-sim")
    ap.add_argument("--port", type=int, default=None, help="move the seat's HTTP port (dist-init = +5)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--existing-cluster", action="store_true",
                    help="the seat's cluster.address is a running multi-host cluster (no one-host Ray mode)")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="sgl-seat-bench-") as tmp:
        os.environ["SGLSEAT_HOME"] = str(Path(tmp) / "home")
        spec = _spec(a.seat, a.port, Path(tmp))
        backend = backend_for(spec.engine)
        if a.draft is None:
            a.draft = "off" if backend.draft_problem(spec) else "on"
        ups: list[StageTimes] = []
        downs: list[StageTimes] = []
        walls: list[tuple[float, float]] = []
        for i in range(a.runs):
            t0 = time.monotonic()
            rec, times = up(spec, UpOptions(draft=a.draft == "on", timeout=a.timeout, no_watchdog=True))
            t1 = time.monotonic()
            downs.append(down(rec.name))
            t2 = time.monotonic()
            ups.append(times)
            walls.append((t1 - t0, t2 - t1))
            print(f"run {i + 1}: up {t1 - t0:.2f} s, down {t2 - t1:.2f} s", file=sys.stderr)

    print(f"sgl-seat up/down overhead: seat {spec.name} ({spec.engine}, {spec.cluster.nodes} nodes, "
          f"cluster {spec.cluster.address}), draft {a.draft}, {a.runs} runs, seconds (watchdog off)")
    print("engine stages: " + ("the sim's start-up (synthetic engine)\n" if backend.synthetic else
                               "real SGLang's own start-up (imports, model, KV pool), not sgl-seat's\n"))
    up_rows = _table("up stage", ups)
    down_rows = _table("down stage", downs)
    engine = ("engine-node0", "engines", "ready")
    rest = [sum(t for n, t in r.stages if n not in engine) for r in ups]
    print(f"up excluding engine start ({', '.join(engine)}): median {statistics.median(rest):.2f} s; runs "
          + ", ".join(f"{v:.2f}" for v in rest))
    print(f"wall clock (incl. planning and connection setup): up median {statistics.median(w[0] for w in walls):.2f} s,"
          f" down median {statistics.median(w[1] for w in walls):.2f} s")
    if a.json:
        print(json.dumps({"up": up_rows, "down": down_rows, "walls": walls}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
