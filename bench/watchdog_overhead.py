#!/usr/bin/env python3
"""What the watchdog costs, measured side by side in one run (synthetic sim figures; labelled so).

1. Sim decode throughput with the sidecars off, on at 1 Hz and on at 5 Hz: rounds of equal windows in rotating
   order (off, 1 Hz, 5 Hz; the next round starts one place later) against one running sim seat under steady
   ``/generate`` traffic; tokens per second per window, the ratio of medians on/off, and the spread of the "off"
   windows as the noise floor. Target: at 1 Hz at most 1 % loss.
2. Probe cost per wrapped call against the bare call (timeit, best of repeats), for an empty function and for
   the sim's real ``fetch_rows`` at the decode gather size. Target: at most 1 microsecond added.
3. Detection-to-bundle latency: a row-fetch stall is injected on rank 3; the time from the first detector
   firing to the bundle being on disk, and from the stall to the bundle. Target: at most 3 s (and 10 s).

The sidecars run in their own process (as the Ray actors do), sampling every engine process of both
simulated nodes with py-spy. Ports 34400-34499. Usage::

    python bench/watchdog_overhead.py [--window 30] [--rounds 2] [--concurrency 16] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sgl_seat.watchdog import probe

# The sim seat rig is a test rig (tests/simrig.py, not in the wheel): import it from the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from tests.simrig import SimSeat

SIM_TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"  # watchdog/probe-targets.yaml, family sim

HTTP_PORT = 34400
EXPORTER_PORT = 34450


def _paired(bare: Any, wrapped: Any, *, number: int, repeat: int) -> tuple[float, float]:
    """Best ns per call of each, measured alternately so that load drift hits both alike."""
    b, w = [], []
    for _ in range(repeat):
        b.append(timeit.timeit(bare, number=number) / number * 1e9)
        w.append(timeit.timeit(wrapped, number=number) / number * 1e9)
    return min(b), min(w)


def probe_cost(repeat: int = 15, number: int = 50_000) -> dict[str, float]:
    """ns per call: bare and wrapped, for an empty function and for the sim's real row fetch."""
    # Shared memory, as on a seat: a ring on a disk file system would add write-back faults.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    ring_dir = tempfile.mkdtemp(prefix="sgl-seat-bench-rings-", dir=shm)
    os.environ[probe.ENV_DIR] = ring_dir
    probe.reset()

    def empty(table: object, ids: object) -> object:
        return ids

    w_empty = probe.make_wrapper(empty, probe.parse_target("bench:empty@ids"))
    ids_list = list(range(32))
    w_empty(None, ids_list)
    out: dict[str, float] = {}
    out["empty_bare_ns"], out["empty_wrapped_ns"] = _paired(lambda: empty(None, ids_list),
                                                            lambda: w_empty(None, ids_list),
                                                            number=number, repeat=repeat)
    try:
        from sgl_seat.sim import rowfetch

        table = rowfetch.make_table(rows=4096)
        ids = rowfetch.make_ids(0, 32, 4096)
        fr = rowfetch.fetch_rows
        w_fr = probe.make_wrapper(fr, probe.parse_target(SIM_TARGET))
        out["fetch_rows_bare_ns"], out["fetch_rows_wrapped_ns"] = _paired(
            lambda: fr(table, ids), lambda: w_fr(table, ids), number=max(500, number // 50), repeat=repeat * 2)
    except ImportError:  # torch not installed: the empty-function figure still stands
        pass
    probe.reset()
    shutil.rmtree(ring_dir, ignore_errors=True)
    return out


def throughput(seat: SimSeat, work: Path, *, window: float, rounds: int, concurrency: int, warmup: float
               ) -> dict[str, list[float]]:
    from tests.simrig import Traffic

    arms = ["off", "1 Hz", "5 Hz"]
    res: dict[str, list[float]] = {a: [] for a in arms}
    steps: dict[str, list[float]] = {a: [] for a in arms}
    traffic = Traffic(seat.url, concurrency=concurrency, max_new_tokens=32).start()
    try:
        time.sleep(warmup)
        for rnd in range(rounds):
            order = arms[rnd % 3:] + arms[:rnd % 3]
            for arm in order:
                proc = None
                if arm != "off":
                    proc = seat.spawn_sidecars(work / "bundles-throughput", sample_hz=1.0 if arm == "1 Hz" else 5.0,
                                               metrics_port=EXPORTER_PORT)
                    time.sleep(3.0)  # the sidecars are up and sampling before the window opens
                t0, f0 = time.time(), seat.forward_count(0)
                time.sleep(window)
                t1, f1 = time.time(), seat.forward_count(0)
                res[arm].append(traffic.tokens_between(t0, t1) / (t1 - t0))
                steps[arm].append((f1 - f0) / (t1 - t0))
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
                print(f"  round {rnd + 1} {arm:>5}: {res[arm][-1]:8.1f} tok/s {steps[arm][-1]:7.2f} steps/s",
                      file=sys.stderr, flush=True)
    finally:
        traffic.stop(10)
    for a in arms:
        res[f"{a} steps"] = steps[a]
    res["false_positive_bundles"] = [float(len(list((work / "bundles-throughput").glob("2*"))))]
    return res


def latency(seat: SimSeat, work: Path, *, concurrency: int) -> dict[str, Any]:
    from tests.simrig import Traffic

    bdir = work / "bundles-latency"
    traffic = Traffic(seat.url, concurrency=concurrency, max_new_tokens=32).start()
    scs = seat.sidecars(bdir, gpu=True)
    try:
        for s in scs.values():
            s.start()
        time.sleep(8)  # stack history before the hang
        t_stall = seat.inject("rowfetch-stall:rank=3", 3)
        deadline = time.time() + 30
        docs: list[dict[str, Any]] = []
        while time.time() < deadline and not docs:
            time.sleep(0.1)
            docs = [d for s in scs.values() for d in s.bundles]
        if not docs:
            return {"error": "no bundle within 30 s"}
        d = docs[0]
        from sgl_seat.forensics import verify_bundle

        steps = verify_bundle(Path(d["path"])).capture
        node_s = {int(s["node"]): float(str(s["detail"]).rstrip("s")) for s in steps if s.get("step") == "capture"}
        return {"node_capture_s": node_s, "stall_to_bundle_s": d["written_at"] - t_stall,
                "detect_to_bundle_s": d["written_at"] - d["detected_at"],
                "stall_to_detect_s": d["detected_at"] - t_stall, "bundle": d["path"],
                "verdict": (d.get("verdict") or {}).get("kind"), "rank": (d.get("verdict") or {}).get("rank")}
    finally:
        seat.clear_faults()
        traffic.stop(10)
        for s in scs.values():
            s.stop()


def _print_probe(cost: dict[str, float]) -> None:
    added = cost["empty_wrapped_ns"] - cost["empty_bare_ns"]
    print(f"{'probe: bare call (ns)':34}{cost['empty_bare_ns']:14.0f}")
    ratio = cost["empty_wrapped_ns"] / cost["empty_bare_ns"]
    print(f"{'probe: wrapped call (ns)':34}{cost['empty_wrapped_ns']:14.0f}{ratio:10.1f}")
    print(f"{'probe: added per call (ns)':34}{added:14.0f}{'':10}{'<= 1000':>14}")
    if "fetch_rows_bare_ns" in cost:
        fr_b, fr_w = cost["fetch_rows_bare_ns"], cost["fetch_rows_wrapped_ns"]
        print(f"{'sim fetch_rows(32 rows) bare (ns)':34}{fr_b:14.0f}")
        print(f"{'sim fetch_rows wrapped (ns)':34}{fr_w:14.0f}{fr_w / fr_b:10.3f}")
        print(f"{'sim fetch_rows: added (ns)':34}{fr_w - fr_b:14.0f}{'':10}{'<= 1000':>14}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=30.0, help="seconds per throughput window")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (off, 1 Hz, 5 Hz); 0 skips throughput")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--draft", choices=("on", "off"), default="on")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--probe-only", action="store_true",
                    help="only the probe's cost per call (needs nothing but the standard library, and torch for "
                         "the sim's fetch_rows): runs on a bare GPU host")
    a = ap.parse_args()

    cost = probe_cost()
    if a.probe_only:
        _print_probe(cost)
        if a.json:
            print(json.dumps({"probe": cost}, indent=2))
        return 0
    import psutil

    from tests.simrig import SimSeat, sim_spec

    work = Path(tempfile.mkdtemp(prefix="sgl-seat-bench-"))
    seat = SimSeat(sim_spec("wd-bench", HTTP_PORT), draft=a.draft == "on", workdir=work)
    print(f"starting a two-node sim seat (draft {a.draft}) in {work} ...", file=sys.stderr, flush=True)
    seat.start()
    try:
        tput = throughput(seat, work, window=a.window, rounds=a.rounds, concurrency=a.concurrency, warmup=a.warmup) \
            if a.rounds > 0 else {}
        lat = latency(seat, work, concurrency=a.concurrency)
    finally:
        seat.stop()

    print("\nwatchdog overhead (sim engine: every throughput figure is SYNTHETIC)")
    print(f"{'':34}{'value':>14}{'ratio':>10}{'target':>14}")
    for unit, suffix in ((("tok/s", ""), ("steps/s", " steps")) if tput else ()):
        off = statistics.median(tput["off" + suffix])
        print(f"{'decode ' + unit + ', sidecars off':34}{off:14.2f}{1.0:10.3f}")
        for arm in ("1 Hz", "5 Hz"):
            med = statistics.median(tput[arm + suffix])
            target = ">= 0.990" if arm == "1 Hz" else ""
            print(f"{'decode ' + unit + ', sidecars on ' + arm:34}{med:14.2f}{med / off:10.3f}{target:>14}")
        if len(tput["off" + suffix]) > 1:
            spread = (max(tput["off" + suffix]) - min(tput["off" + suffix])) / off
            print(f"{'  noise: spread of the off windows':34}{spread * 100:13.1f}%")
    if tput:
        print(f"{'bundles during healthy traffic':34}{tput['false_positive_bundles'][0]:14.0f}{'':10}{'0':>14}")
    _print_probe(cost)
    if "error" in lat:
        print(f"{'detection to bundle':34}{'FAILED: ' + lat['error']:>24}")
    else:
        print(f"{'stall to detection (s)':34}{lat['stall_to_detect_s']:14.2f}")
        print(f"{'detection to bundle (s)':34}{lat['detect_to_bundle_s']:14.2f}{'':10}{'<= 3.00':>14}")
        for n, s in sorted(lat["node_capture_s"].items()):
            print(f"{'  of which node ' + str(n) + ' capture (s)':34}{s:14.2f}")
        print(f"{'stall to bundle (s)':34}{lat['stall_to_bundle_s']:14.2f}{'':10}{'<= 10.00':>14}")
        print(f"{'verdict':34}{str(lat['verdict']) + ' rank ' + str(lat['rank']):>24}")
    if a.json:
        print(json.dumps({"throughput": tput, "probe": cost, "latency": lat}, indent=2))
    left = [c.pid for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    if left:
        print(f"warning: processes left behind: {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
