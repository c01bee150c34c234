#!/usr/bin/env python3
"""What the watchdog costs, measured side by side in one run (synthetic sim figures; labelled so).

1. Sampling cost: decode throughput of one running sim seat under steady ``/generate`` traffic with the
   sidecars off and on (1 Hz, and 5 Hz with ``--hz 1,5``), in ABBA quads (off, on, on, off: a linear drift
   hits both arms alike), >= 10 quads per rate. Each quad gives a ratio on/off (steps per second, and tokens
   per second); printed: their mean with a 95 % interval (Student t over the quads), and the spread of the
   "off" windows as the noise floor. Target: the interval's lower bound at 1 Hz >= 0.99, on steps per second:
   tokens are counted when their request completes, so a window's token count is lumpy (13 % off-window spread
   at 5 s windows on a 16-core host, against 3 % for steps).
2. Probe cost per call around the sim's real ``fetch_rows`` (a host gather of ``rows`` x 7168 bf16 from the
   sim's 4096-row table, fresh ids every call, so each call evicts what the one before left in cache) at the
   field report's gather sizes (1, 4, 8, 32 rows: draft off 1-32 running requests x 1 token, draft on up to
   8 slots x 4 draft tokens), bare and wrapped calls interleaved in rotating order, one timer read per call;
   added = median wrapped - median bare, with a 95 % interval over 20 blocks of the run. Also the empty
   function (the probe's own floor). Target: at most 1 microsecond added around the real fetch.
3. Detection-to-bundle latency: a row-fetch stall is injected on rank 3; the time from the first detector
   firing to the bundle being on disk, and from the stall to the bundle. Target: at most 3 s (and 10 s).

The sidecars run in their own process (as the Ray actors do), sampling every engine process of both
simulated nodes with py-spy. Ports 31040-31099 (below Linux's ephemeral range). Usage::

    python bench/watchdog_overhead.py [--window 10] [--quads 10] [--hz 1,5] [--json]
    python bench/watchdog_overhead.py --probe-only      # no seat: the probe's cost alone
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

# The sim seat rig is a test rig (rigs/simrig.py, not in the wheel): import it from the checkout (which also
# serves sgl_seat itself on a machine where it is not installed, e.g. the GPU host).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sgl_seat import probe

if TYPE_CHECKING:
    from rigs.simrig import SimSeat

SIM_TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"  # watchdog/probe-targets.yaml, family sim
#: The field report's gather sizes (rows per fetch): draft off 1..32 running x 1 token, draft on 8 slots x 4 tokens.
GATHER_SIZES = (1, 4, 8, 32)
BLOCKS = 20

HTTP_PORT = 31040  # node 1 at +10, dist-init at +5, admin routes at +2
EXPORTER_PORT = 31090

# Student t, two-sided 95 %, by degrees of freedom (n - 1); larger n uses 1.96.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 24: 2.064, 29: 2.045, 39: 2.023, 59: 2.001}


def mean_ci95(xs: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): a Student-t 95 % interval for the mean of ``xs`` (independent per-block figures)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    df = len(xs) - 1
    t = _T95.get(df) or next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)
    half = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def trimmed_mean(xs: Sequence[int], cut: float = 0.01) -> float:
    """Mean without the top and bottom 1 %. Why the mean: where calls differ (with GPU-event coalescing, a call
    records an event or none) the mean, not the median, is the cost per call; the trim drops the OS's and an
    event reader's rare long interruptions."""
    ys = sorted(xs)
    k = int(len(ys) * cut)
    ys = ys[k:len(ys) - k] if k else ys
    return sum(ys) / len(ys)


def interleaved_ns(arms: dict[str, Callable[[Any], Any]], inputs: Sequence[Any], calls: int,
                   warmup: int = 300) -> dict[str, list[int]]:
    """Nanoseconds of each call, per arm: arms called in rotating order, each call on the next input.

    One ``perf_counter_ns`` pair per call (its own cost is in every arm alike and cancels in differences).
    """
    pc = time.perf_counter_ns
    names = list(arms)
    out: dict[str, list[int]] = {n: [] for n in names}
    k = 0
    for _ in range(warmup):
        for n in names:
            arms[n](inputs[k % len(inputs)])
            k += 1
    for i in range(calls):
        r = i % len(names)
        for n in names[r:] + names[:r]:
            f, x = arms[n], inputs[k % len(inputs)]
            k += 1
            t0 = pc()
            f(x)
            out[n].append(pc() - t0)
    return out


def added_ns(times: dict[str, list[int]], arm: str, base: str = "bare", blocks: int = BLOCKS) -> dict[str, float]:
    """What ``arm`` adds over ``base``: median difference overall, and its mean over blocks with a 95 % interval."""
    a, b = times[arm], times[base]
    n = min(len(a), len(b)) // blocks
    per_block = [statistics.median(a[i * n:(i + 1) * n]) - statistics.median(b[i * n:(i + 1) * n])
                 for i in range(blocks)]
    m, lo, hi = mean_ci95(per_block)
    return {"median_ns": statistics.median(a) - statistics.median(b), "mean_ns": m, "ci95_low_ns": lo,
            "ci95_high_ns": hi, "base_median_ns": statistics.median(b)}


#: The probe package's directory (what watchdog/boot/sitecustomize.py loads by path into an engine).
PROBE_DIR = Path(probe.__file__).resolve().parent


def load_probe_copy(name: str, path: Path = PROBE_DIR) -> ModuleType:
    """A separate copy of the probe under the module name ``name``: its own globals, ring and reader thread (the
    C writer's ring is one per process, so arms that each need their own ring take the Python writer). ``path`` is
    the probe package's directory, loaded by path as the boot loads it (its modules import each other relatively,
    so the copy's modules are ``name.writer`` etc., apart from every other copy's), or an older single-file
    ``probe.py``."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                      submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def probe_cost(calls: int = 6000, sizes: Sequence[int] = GATHER_SIZES) -> dict[str, Any]:
    """The probe's cost per call: around an empty function, and around the sim's real ``fetch_rows`` by gather size."""
    # Shared memory, as on a seat: a ring on a disk file system would add write-back faults.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    ring_dir = tempfile.mkdtemp(prefix="sgl-seat-bench-rings-", dir=shm)
    saved = os.environ.get(probe.ENV_DIR)
    os.environ[probe.ENV_DIR] = ring_dir
    probe.reset()
    out: dict[str, Any] = {"calls_per_arm": calls, "blocks": BLOCKS}
    try:
        def empty(table: object, ids: object) -> object:
            return ids

        out["writer"] = probe.native_state()
        native = probe.writer._native() is not None
        w_empty = probe.make_wrapper(empty, probe.parse_target("bench:empty@ids"))
        p_empty = probe.make_wrapper(empty, probe.parse_target("bench:empty@ids"), python=True)
        lists = [list(range(32))]
        # A heartbeat (mode beat, sgl_seat/probe/beat.py) around the same empty function: what a decoder layer's call
        # pays for its beat (a clock read and a compare; a ring write at most every 0.1 s).
        b_empty = probe.beat.make_beat_wrapper(empty, probe.parse_target("bench:empty@:beat"))
        arms: dict[str, Callable[[Any], Any]] = {"bare": lambda x: empty(None, x), "probe": lambda x: w_empty(None, x),
                                                 "beat": lambda x: b_empty(None, x)}
        if native:
            arms["python"] = lambda x: p_empty(None, x)
        t = interleaved_ns(arms, lists, calls * 5)
        out["empty"] = added_ns(t, "probe")
        out["beat_empty"] = added_ns(t, "beat")
        if native:
            out["python_empty"] = added_ns(t, "python")
        try:
            import torch

            from sgl_seat.sim import rowfetch
        except ImportError:  # torch not installed: the empty-function figure still stands
            return out
        torch.set_num_threads(1)  # as the sim's schedulers run
        table = rowfetch.make_table()
        fr = rowfetch.fetch_rows
        w_fr = probe.make_wrapper(fr, probe.parse_target(SIM_TARGET))
        p_fr = probe.make_wrapper(fr, probe.parse_target(SIM_TARGET), python=True)
        for size in sizes:
            ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
            arms = {"bare": lambda x: fr(table, x), "probe": lambda x: w_fr(table, x)}
            if native:
                arms["python"] = lambda x: p_fr(table, x)
            t = interleaved_ns(arms, ids, calls)
            out[f"fetch_rows_{size}"] = added_ns(t, "probe")
            if native:
                out[f"python_fetch_rows_{size}"] = added_ns(t, "python")
        return out
    finally:
        probe.reset()
        shutil.rmtree(ring_dir, ignore_errors=True)
        if saved is None:
            os.environ.pop(probe.ENV_DIR, None)
        else:
            os.environ[probe.ENV_DIR] = saved


def abba_ratios(off: Sequence[float], on: Sequence[float]) -> list[float]:
    """One ratio per ABBA quad: (on1 + on2) / (off1 + off2), windows given in time order per arm."""
    return [(on[2 * i] + on[2 * i + 1]) / (off[2 * i] + off[2 * i + 1]) for i in range(min(len(off), len(on)) // 2)]


def throughput(seat: SimSeat, work: Path, *, window: float, quads: int, rates: Sequence[float], concurrency: int,
               warmup: float) -> dict[str, Any]:
    """ABBA quads per sampling rate: off, on, on, off (the two "on" windows share one sidecar process)."""
    from rigs.simrig import Traffic

    res: dict[str, Any] = {}
    bdir = work / "bundles-throughput"
    traffic = Traffic(seat.url, concurrency=concurrency, max_new_tokens=32).start()
    try:
        time.sleep(warmup)

        def window_rates() -> tuple[float, float]:
            t0, f0 = time.time(), seat.forward_count(0)
            time.sleep(window)
            t1, f1 = time.time(), seat.forward_count(0)
            return traffic.tokens_between(t0, t1) / (t1 - t0), (f1 - f0) / (t1 - t0)

        for hz in rates:
            arm: dict[str, list[float]] = {"off tok/s": [], "on tok/s": [], "off steps/s": [], "on steps/s": []}
            for q in range(quads):
                for phase in ("off", "on"):
                    proc = None
                    if phase == "on":
                        proc = seat.spawn_sidecars(bdir, sample_hz=hz, metrics_port=EXPORTER_PORT)
                        time.sleep(3.0)  # the sidecars are up and sampling before the window opens
                    else:
                        time.sleep(1.0)  # the same gap after a sidecar stop as before an "on" window
                    for _ in range(2 if phase == "on" else 1):
                        tok, st = window_rates()
                        arm[f"{phase} tok/s"].append(tok)
                        arm[f"{phase} steps/s"].append(st)
                    if proc is not None:
                        proc.send_signal(signal.SIGTERM)
                        proc.wait(30)
                tok, st = window_rates()  # the quad's closing "off"
                arm["off tok/s"].append(tok)
                arm["off steps/s"].append(st)
                print(f"  {hz:g} Hz quad {q + 1}: off {arm['off tok/s'][-2]:.1f}, on {arm['on tok/s'][-2]:.1f} "
                      f"{arm['on tok/s'][-1]:.1f}, off {arm['off tok/s'][-1]:.1f} tok/s", file=sys.stderr, flush=True)
            summary: dict[str, Any] = {"windows": arm}
            for unit in ("tok/s", "steps/s"):
                ratios = abba_ratios(arm[f"off {unit}"], arm[f"on {unit}"])
                m, lo, hi = mean_ci95(ratios)
                offs = arm[f"off {unit}"]
                summary[unit] = {"ratios": ratios, "mean": m, "ci95": [lo, hi],
                                 "off_spread": (max(offs) - min(offs)) / statistics.median(offs),
                                 "off_cv": statistics.stdev(offs) / statistics.fmean(offs)}
            res[f"{hz:g} Hz"] = summary
    finally:
        traffic.stop(10)
    res["false_positive_bundles"] = len(list(bdir.glob("2*")))
    return res


def latency(seat: SimSeat, work: Path, *, concurrency: int) -> dict[str, Any]:
    from rigs.simrig import Traffic

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


def print_probe(cost: dict[str, Any]) -> None:
    """The probe's cost table (shared with bench/gpu/gpu_watchdog.py)."""
    print(f"probe writer: {cost.get('writer', 'python')}")
    print(f"{'probe cost per call (ns)':48}{'base':>10}{'added':>10}{'95 % interval':>18}{'target':>10}")
    for key, fig in cost.items():
        if not isinstance(fig, dict):
            continue
        py = key.startswith("python_")
        k = key.removeprefix("python_")
        label = "heartbeat (beat): empty function" if k == "beat_empty" else "empty function" if k == "empty" \
            else k.replace("fetch_rows_", "sim fetch_rows, ") + " rows"
        label = ("Python writer: " if py else "") + label
        ci = f"{fig['ci95_low_ns']:.0f}..{fig['ci95_high_ns']:.0f}"
        print(f"{'  ' + label:48}{fig['base_median_ns']:10.0f}{fig['median_ns']:10.0f}{ci:>18}{'<= 1000':>10}")


def print_throughput(tput: dict[str, Any]) -> None:
    print(f"{'decode throughput, on/off (ABBA)':34}{'mean':>10}{'95 % interval':>18}{'off spread':>12}"
          f"{'off CV':>9}{'target':>10}")
    for rate, summary in tput.items():
        if not isinstance(summary, dict):
            continue
        for unit in ("steps/s", "tok/s"):
            f = summary[unit]
            target = "low >= 0.990" if rate == "1 Hz" and unit == "steps/s" else ""
            label = f"  {rate}, {unit} ({len(f['ratios'])} quads)"
            print(f"{label:34}{f['mean']:10.4f}"
                  f"{f['ci95'][0]:9.4f}..{f['ci95'][1]:.4f}{f['off_spread'] * 100:11.1f}%{f['off_cv'] * 100:8.2f}%"
                  f"{target:>13}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=10.0, help="seconds per throughput window")
    ap.add_argument("--quads", type=int, default=10, help="ABBA quads per sampling rate; 0 skips throughput")
    ap.add_argument("--hz", default="1", help="sampling rates, comma-separated (e.g. 1,5)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--draft", choices=("on", "off"), default="on")
    ap.add_argument("--calls", type=int, default=6000, help="probe cost: calls per arm and gather size")
    ap.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    ap.add_argument("--probe-only", action="store_true",
                    help="only the probe's cost per call (needs nothing but the standard library, and torch for "
                         "the sim's fetch_rows): runs on a bare GPU host")
    a = ap.parse_args()

    cost = probe_cost(a.calls)
    if a.probe_only:
        print_probe(cost)
        if a.json:
            print(json.dumps({"probe": cost}, indent=2))
        return 0
    import psutil

    from rigs.simrig import SimSeat, sim_spec

    work = Path(tempfile.mkdtemp(prefix="sgl-seat-bench-"))
    seat = SimSeat(sim_spec("wd-bench", HTTP_PORT), draft=a.draft == "on", workdir=work)
    print(f"starting a two-node sim seat (draft {a.draft}) in {work} ...", file=sys.stderr, flush=True)
    seat.start()
    try:
        rates = [float(x) for x in a.hz.split(",") if x.strip()]
        tput = throughput(seat, work, window=a.window, quads=a.quads, rates=rates, concurrency=a.concurrency,
                          warmup=a.warmup) if a.quads > 0 else {}
        lat = latency(seat, work, concurrency=a.concurrency)
    finally:
        seat.stop()

    print("\nwatchdog overhead (sim engine: every throughput figure is SYNTHETIC)")
    if tput:
        print_throughput(tput)
        print(f"{'bundles during healthy traffic':34}{tput['false_positive_bundles']:10d}{'':28}{'0':>10}")
    print_probe(cost)
    if "error" in lat:
        print(f"{'detection to bundle':34}{'FAILED: ' + lat['error']:>24}")
    else:
        print(f"{'stall to detection (s)':34}{lat['stall_to_detect_s']:10.2f}")
        print(f"{'detection to bundle (s)':34}{lat['detect_to_bundle_s']:10.2f}{'':28}{'<= 3.00':>10}")
        for n, s in sorted(lat["node_capture_s"].items()):
            print(f"{'  of which node ' + str(n) + ' capture (s)':34}{s:10.2f}")
        print(f"{'stall to bundle (s)':34}{lat['stall_to_bundle_s']:10.2f}{'':28}{'<= 10.00':>10}")
        print(f"{'verdict':34}{str(lat['verdict']) + ' rank ' + str(lat['rank']):>24}")
    if a.json:
        print(json.dumps({"throughput": tput, "probe": cost, "latency": lat}, indent=2))
    left = [c.pid for c in psutil.Process().children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    if left:
        print(f"warning: processes left behind: {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
