"""The probe's cost per call on a GPU host, C writer against Python writer, around the sim's real CUDA-mode fetch.

Why: issue 12 asks that the probe with its CUDA events add at most 2 us per call; session 4 measured that with
the Python writer only (the C writer, ``sgl_seat/probe/probe_native.c``, came in session 5 and was measured on
a CPU machine only). Both writers share one ring, one call counter and one GPU timer in a process
(``make_wrapper(..., python=True)`` is the Python one), so they can be interleaved call by call with a bare call:
arms ``bare``, ``c`` and ``py`` in rotating order, each call on the next of 1009 id lists. One session per GPU
mode, so every arm sees the same timer:

- ``host``: GPU timing off (the host-only probe);
- ``events``: the probe's default (timing events, 1 ms coalescing window, the reader thread running);
- ``plain``: plain events (``SGLSEAT_PROBE_GPU_TIMING=0``), same window;
- ``every``: an event after every call (window 0), timing events;
- ``nofast``: as ``events``, but the C writer calls the timer's Python ``end`` for every call (``timer._fast``
  None: what the C writer did before it took the timer's work over);
- ``nocrec``: as ``events``, the C writer queueing coalesced calls itself but leaving every event's record to
  ``end`` (``record_addr`` 0: what it did at 9b92344);
- ``noreader``: as ``events`` with the reader thread off (the timer polled once after each gather size, so at
  most 1,500 calls per arm fit its queue): what the reader's publishing costs the calling thread;
- ``exactkey``: as ``events``, the C writer asking for the thread's current device on every call (what it did
  at f0aaad3) instead of keying coalesced calls by the device fixed at start.

Printed per gather size (1/4/8/32 rows) and mode: each writer's cost over ``bare`` as the median difference
(with a 95 % interval over 20 blocks) and as the difference of 1 %-trimmed means; with coalescing calls differ
(an event or none), so the trimmed mean is the cost per call. First it says whether the C writer built here
(the image's compiler and ``Python.h``) and what it loaded.

    python bench/gpu/writer_cost.py --calls 4000 --rounds 2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"


def build_env() -> dict[str, Any]:
    """What the C writer's build needs on this image: the compiler sysconfig names and the interpreter's headers."""
    inc = sysconfig.get_paths()["include"]
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return {"python": sys.version.split()[0], "executable": sys.executable, "cc": cc, "cc_path": shutil.which(cc),
            "include": inc, "python_h": os.path.exists(os.path.join(inc, "Python.h"))}


def lookup_cost(torch: Any, rowfetch: Any, table: Any, calls: int) -> list[dict[str, Any]]:
    """The stream key's pieces right after the fetch (whose gather evicts the caches they need): arms are the
    fetch followed by ``_cuda_getCurrentRawStream(-1)`` (the exact key), by it with the device index given (the C
    writer's key for coalesced calls), by it with ``_cuda_getDevice()`` asked first (the key before f0aaad3), by
    ``_cuda_getDevice()`` alone, and by an empty lambda (the arms' own call overhead)."""
    from watchdog_overhead import GATHER_SIZES, interleaved_ns, trimmed_mean

    raw, getdev = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    dev = getdev()
    fr = rowfetch.fetch_rows

    def then(extra: Any) -> Any:
        def arm(x: Any) -> None:
            fr(table, x)
            extra()
        return arm

    arms = {"bare": lambda x: fr(table, x), "raw_minus1": then(lambda: raw(-1)), "raw_dev": then(lambda: raw(dev)),
            "raw_getdev": then(lambda: raw(getdev())), "getdev": then(getdev),
            "lambda_only": then(lambda: None)}
    res = []
    for size in GATHER_SIZES:
        ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
        t = interleaved_ns(arms, ids, calls)
        torch.cuda.synchronize()
        row = {"rows": size, **{f"{n}_trimmed_mean_over_bare_ns": trimmed_mean(t[n]) - trimmed_mean(t["bare"])
                                for n in arms if n != "bare"}}
        res.append(row)
        print(f"lookups rows {size:2d}:", {k.replace("_trimmed_mean_over_bare_ns", ""): round(v)
                                          for k, v in row.items() if k != "rows"}, flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=4000, help="calls per arm, gather size and mode")
    ap.add_argument("--rounds", type=int, default=2, help="repeats of the whole set of modes")
    ap.add_argument("--modes", default="host,events,nofast,nocrec,plain,every")
    ap.add_argument("--lookups", action="store_true",
                    help="also: what the stream key's torch calls cost right after the fetch, by gather size")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="writer-cost-", dir="/dev/shm")
    os.environ["SGLSEAT_PROBE_GPU"] = "0"  # turned on per mode below
    out: dict[str, Any] = {"build_env": build_env()}
    print(json.dumps(out), flush=True)

    import torch
    from watchdog_overhead import GATHER_SIZES, added_ns, interleaved_ns, trimmed_mean

    from sgl_seat import probe
    from sgl_seat.sim import rowfetch

    out["writer"] = probe.native_state()
    out["commit"] = os.environ.get("SGLSEAT_COMMIT")
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(json.dumps({"writer": out["writer"], "gpu": out["gpu"]}), flush=True)
    if probe.writer._native() is None:
        print("the C writer did not load here: only the Python writer is measured", flush=True)
    torch.set_num_threads(1)
    torch.zeros(1, device="cuda")
    rowfetch.use_cuda(torch.device("cuda", 0), cycles_per_s=1e9, max_rows=max(GATHER_SIZES))
    table = rowfetch.pin_table(rowfetch.make_table())
    fr = rowfetch.fetch_rows
    spec = probe.parse_target(TARGET)
    arms_fn: dict[str, Any] = {"bare": fr, "py": probe.make_wrapper(fr, spec, python=True)}
    if probe.writer._native() is not None:
        arms_fn["c"] = probe.make_wrapper(fr, spec)
    arms_fn["py"](table, rowfetch.make_ids(0, 1, table.shape[0]))  # creates the ring
    modes = {"host": None, "events": (probe.DEFAULT_COALESCE_US, True), "plain": (probe.DEFAULT_COALESCE_US, False),
             "every": (0.0, True), "nofast": (probe.DEFAULT_COALESCE_US, True),
             "nocrec": (probe.DEFAULT_COALESCE_US, True), "exactkey": (probe.DEFAULT_COALESCE_US, True),
             "noreader": (probe.DEFAULT_COALESCE_US, True)}
    rows: list[dict[str, Any]] = []
    for rnd in range(a.rounds):
        for mode in a.modes.split(","):
            probe.disable_gpu()
            timer = None
            if modes[mode] is not None:
                w_us, timing = modes[mode]
                timer = probe.enable_gpu_cuda(torch, probe.DEFAULT_GPU_PATH, coalesce_us=w_us, timing=timing,
                                              start_thread=mode != "noreader")
                assert timer is not None
                if mode == "nofast":
                    timer._fast = None
                elif mode == "nocrec" and timer._fast is not None:
                    timer._fast = (*timer._fast[:3], 0, timer._fast[4])
                elif mode == "exactkey" and timer._fast is not None:
                    caps, key_fn, _fixed, addr, exact = timer._fast
                    timer._fast = (caps, key_fn, exact, addr, exact)
                elif timer._fast is None:
                    print(f"{mode}: the timer has no C fast path here", flush=True)
                if mode == "events" and "c_records_events" not in out:
                    out["c_records_events"] = bool(timer._fast and timer._fast[3])
                    print(f"C writer records events itself: {out['c_records_events']}", flush=True)
            for size in GATHER_SIZES:
                ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
                fns = {n: (lambda x, f=f: f(table, x)) for n, f in arms_fn.items()}
                rec0 = timer.recorded if timer is not None else 0
                calls = min(a.calls, 1500) if mode == "noreader" else a.calls
                t = interleaved_ns(fns, ids, calls)
                torch.cuda.synchronize()
                if mode == "noreader" and timer is not None:
                    timer.poll()
                row: dict[str, Any] = {"round": rnd, "mode": mode, "rows": size,
                                       "bare_median_ns": added_ns(t, "py")["base_median_ns"]}
                for n in arms_fn:
                    if n == "bare":
                        continue
                    row[f"{n}_over_bare"] = added_ns(t, n)
                    row[f"{n}_trimmed_mean_over_bare_ns"] = trimmed_mean(t[n]) - trimmed_mean(t["bare"])
                if timer is not None:
                    probed = calls * (len(arms_fn) - 1) + 300 * (len(arms_fn) - 1)
                    row["events_recorded_share"] = (timer.recorded - rec0) / probed
                    row["timer_errors"] = timer.errors
                rows.append(row)
                short = {n: (round(row[f"{n}_over_bare"]["median_ns"]), round(row[f"{n}_trimmed_mean_over_bare_ns"]))
                         for n in arms_fn if n != "bare"}
                print(f"round {rnd} {mode:6s} rows {size:2d} bare {row['bare_median_ns']:.0f} ns; added over bare "
                      f"(median, trimmed mean) {short}"
                      + (f"; events on {row['events_recorded_share']:.0%} of calls" if timer is not None else ""),
                      flush=True)
            probe.disable_gpu()
    out["rows"] = rows
    if a.lookups:
        out["lookups"] = lookup_cost(torch, rowfetch, table, a.calls)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "writer_cost.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
