"""The probe's GPU timing, old (two events per call) vs new (one), around the sim's real CUDA-mode fetch.

Why: issue 12 asks that GPU timing add at most 2 us per call over the host-only probe. Each arm is a separate
copy of a probe module (its own ring, its own event reader thread, as in an engine), so arms can be interleaved
call by call in one process:

- ``bare``: ``sgl_seat.sim.rowfetch.fetch_rows`` in CUDA mode (host gather into pinned staging, copy to GPU 0);
- ``host``: this checkout's probe, GPU timing off;
- ``ev_base`` / ``ev_ctypes``: this checkout's probe with an event after every call (coalescing off), through
  ``_CudaEventBase.record`` (cached stream) and ctypes ``cudaEventRecord``; ``ev_base_w<W>``: calls within
  W us (``--coalesce-us``, default 200,1000; 1000 is the probe's default) of their stream's last event riding on the
  next one;
- ``ev_base_w1000_plain`` (``--plain``): the default window with plain events (``SGLSEAT_PROBE_GPU_TIMING=0``);
- ``old_pair`` (``--old PATH``, a copy of the previous probe.py): two events per call through ctypes, the reader
  querying every pending pair.

Two sessions, each interleaving bare, host and one group of event arms (the readers of one group run while it
is measured): ``new`` (ev_base, ev_ctypes, ev_base_w<W>) and ``old`` (old_pair). Printed per gather size: the
median of each arm minus the median of ``host`` (what events add) and of ``bare``, with a 95 % interval over 20
blocks, and the 1 %-trimmed mean minus ``host``'s (with coalescing, the cost per call is the mean). Then the
host-only probe's cost around an empty function (issue 15.2's host target) for reference.

    python bench/gpu/probe_ab.py --old /tmp/probe_prev.py --calls 4000 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from watchdog_overhead import (  # noqa: E402
    GATHER_SIZES,
    added_ns,
    interleaved_ns,
    load_probe_copy,
    trimmed_mean,
)

from sgl_seat.sim import rowfetch  # noqa: E402

TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default=None, help="a copy of the previous probe.py (two events per call)")
    ap.add_argument("--calls", type=int, default=4000, help="calls per arm and gather size")
    ap.add_argument("--cold-pools", dest="warm_pools", action="store_false",
                    help="no warm event pool for the old probe (the new one always prefills)")
    ap.add_argument("--coalesce-us", default="200,1000", help="windows of the ev_base_w* arms (us, comma-separated)")
    ap.add_argument("--plain", action="store_true", help="also the 1 ms window with plain (no timing) events")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="probe-ab-", dir="/dev/shm")
    # The Python writer: each arm here is a separate copy of the probe package with its own ring, and the C
    # writer's ring is one per process (the shared object's state), so its arms would write into one another's
    # rings. What this script measured (session 4) was the Python writer; bench/gpu/writer_cost.py measures the C one.
    os.environ["SGLSEAT_PROBE_NATIVE"] = "0"
    os.environ["SGLSEAT_PROBE_GPU"] = "0"  # each copy's GPU timing is turned on explicitly below
    torch.set_num_threads(1)
    torch.zeros(1, device="cuda")
    rowfetch.use_cuda(torch.device("cuda", 0), cycles_per_s=1e9, max_rows=max(GATHER_SIZES))
    table = rowfetch.pin_table(rowfetch.make_table())
    fr = rowfetch.fetch_rows

    def wrapped(mod: ModuleType) -> Any:
        return mod.make_wrapper(fr, mod.parse_target(TARGET))

    host_mod = load_probe_copy("probe_host")
    arms: dict[str, Any] = {"bare": fr, "host": wrapped(host_mod)}
    groups: dict[str, dict[str, Any]] = {"new": {}, "old": {}}
    timers: dict[str, Any] = {}
    variants = [("base", 0.0, True), ("ctypes", 0.0, True)]
    variants += [("base", float(w), True) for w in a.coalesce_us.split(",") if float(w)]
    if a.plain:  # the default window with plain (no timing) events
        variants.append(("base", 1000.0, False))
    for how, w_us, timing in variants:
        name = f"ev_{how}" + (f"_w{w_us:g}" if w_us else "") + ("" if timing else "_plain")
        mod = load_probe_copy(f"probe_{name}")
        w = wrapped(mod)
        w(table, rowfetch.make_ids(0, 1, table.shape[0]))  # creates the ring
        timers[name] = mod.enable_gpu_cuda(torch, how, coalesce_us=w_us, timing=timing)
        groups["new"][name] = w
    if a.old:
        old = load_probe_copy("probe_old_pair", Path(a.old))
        w = wrapped(old)
        w(table, rowfetch.make_ids(0, 1, table.shape[0]))
        raw = old._raw_recorder(torch)
        timers["old_pair"] = old.enable_gpu(raw[0], torch.cuda.is_current_stream_capturing, record=raw[1])
        if a.warm_pools:  # the same warm pool as the new probe's prefill, so the comparison is of the records
            timers["old_pair"]._free.extend((raw[0](), raw[0]()) for _ in range(1024))
        groups["old"]["old_pair"] = w
    out: dict[str, Any] = {"calls_per_arm": a.calls, "gather_sizes": list(GATHER_SIZES),
                           "old_pool_warm": bool(a.old and a.warm_pools)}
    for gname, garms in groups.items():
        if not garms:
            continue
        for size in GATHER_SIZES:
            ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
            fns = {n: (lambda x, f=f: f(table, x)) for n, f in {**arms, **garms}.items()}
            t = interleaved_ns(fns, ids, a.calls)
            torch.cuda.synchronize()
            fig: dict[str, Any] = {"bare_median_ns": added_ns(t, "host")["base_median_ns"],
                                   "host_over_bare": added_ns(t, "host")}
            for n in garms:
                fig[f"{n}_over_host"] = added_ns(t, n, base="host")
                fig[f"{n}_over_bare"] = added_ns(t, n)
                fig[f"{n}_trimmed_mean_over_host_ns"] = trimmed_mean(t[n]) - trimmed_mean(t["host"])
            out[f"{gname}_rows_{size}"] = fig
            short = {k: round(v["median_ns"]) for k, v in fig.items() if isinstance(v, dict) and "_over_host" in k}
            short.update({k.replace("_trimmed_mean_over_host_ns", "_mean"): round(v) for k, v in fig.items()
                          if k.endswith("_trimmed_mean_over_host_ns")})
            print(f"{gname} rows {size:3d} bare {fig['bare_median_ns']:.0f} ns; added (median ns) {short}",
                  flush=True)
    out["timer_errors"] = {n: getattr(tm, "errors", None) for n, tm in timers.items()}
    out["reader_queries"] = {n: getattr(tm, "queries", None) for n, tm in timers.items()}
    out["events_recorded"] = {n: getattr(tm, "recorded", None) for n, tm in timers.items()}

    def empty(table: object, ids: object) -> object:
        return ids

    w_empty = host_mod.make_wrapper(empty, host_mod.parse_target("bench:empty@ids"))
    t = interleaved_ns({"bare": lambda x: empty(None, x), "probe": lambda x: w_empty(None, x)}, [list(range(32))],
                       a.calls * 5)
    out["host_probe_empty_fn"] = added_ns(t, "probe")
    print("host-only probe around an empty function, added median ns:", round(out["host_probe_empty_fn"]["median_ns"]))
    print(json.dumps(out, indent=1), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "probe_ab.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
