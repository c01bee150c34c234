"""Where the probe's GPU-timing cost goes around the sim's real CUDA fetch: the runtime call vs the probe's own work.

Why: one event per call adds ~1.2-1.7 us around an empty function but 2-3.3 us around the real fetch (host gather
into pinned staging, non-blocking copy to GPU 0). Arms, interleaved call by call (``watchdog_overhead.
interleaved_ns``), each the fetch followed by: nothing (``bare``); the current raw stream's lookup (``stream``);
``_CudaEventBase.record`` of a plain event on the cached stream (``rec_base``); ctypes ``cudaEventRecord`` of a
plain event on the raw stream (``rec_ctypes``); and the fetch wrapped by the probe, host only (``probe_host``)
and with its events (``probe_event``: the default, calls within 1 ms of their stream's last event riding on the
next one; ``probe_event_w0``: an event after every call; reader threads running). Printed: each arm's median
minus ``bare``'s.

    python bench/gpu/record_after_copy.py [--calls 4000] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from watchdog_overhead import added_ns, interleaved_ns, load_probe_copy  # noqa: E402

from sgl_seat.sim import rowfetch  # noqa: E402

TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="rec-after-copy-", dir="/dev/shm")
    # The Python writer: each arm here is a separate copy of the probe package with its own ring, and the C
    # writer's ring is one per process (the shared object's state), so its arms would write into one another's
    # rings. What this script measured (session 4) was the Python writer; bench/gpu/writer_cost.py measures the C one.
    os.environ["SGLSEAT_PROBE_NATIVE"] = "0"
    os.environ["SGLSEAT_PROBE_GPU"] = "0"
    torch.set_num_threads(1)
    torch.zeros(1, device="cuda")
    rowfetch.use_cuda(torch.device("cuda", 0), cycles_per_s=1e9, max_rows=32)
    table = rowfetch.pin_table(rowfetch.make_table())
    fr = rowfetch.fetch_rows
    raw, getdev = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    cur = torch.cuda.current_stream()
    base_record = torch._C._CudaEventBase.record
    plain = torch.cuda.Event()
    plain.record()
    rt = ctypes.CDLL("libcudart.so.13")
    rec = rt.cudaEventRecord
    rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rec.restype = ctypes.c_int
    handle = plain.cuda_event
    mods = {name: load_probe_copy(name) for name in ("probe_host", "probe_event", "probe_event_w0")}
    wh = mods["probe_host"].make_wrapper(fr, mods["probe_host"].parse_target(TARGET))
    we = mods["probe_event"].make_wrapper(fr, mods["probe_event"].parse_target(TARGET))
    we0 = mods["probe_event_w0"].make_wrapper(fr, mods["probe_event_w0"].parse_target(TARGET))
    we(table, rowfetch.make_ids(0, 1, table.shape[0]))
    we0(table, rowfetch.make_ids(0, 1, table.shape[0]))
    timer = mods["probe_event"].enable_gpu_cuda(torch)
    timer0 = mods["probe_event_w0"].enable_gpu_cuda(torch, coalesce_us=0)

    def f_stream(x: Any) -> None:
        fr(table, x)
        raw(getdev())

    def f_base(x: Any) -> None:
        fr(table, x)
        base_record(plain, cur)

    def f_ctypes(x: Any) -> None:
        fr(table, x)
        rec(handle, raw(getdev()))

    arms = {"bare": lambda x: fr(table, x), "stream": f_stream, "rec_base": f_base, "rec_ctypes": f_ctypes,
            "probe_host": lambda x: wh(table, x), "probe_event": lambda x: we(table, x),
            "probe_event_w0": lambda x: we0(table, x)}
    out: dict[str, Any] = {"calls_per_arm": a.calls}
    for size in (1, 8, 32):
        ids = [rowfetch.make_ids(seed, size, table.shape[0]) for seed in range(1009)]
        t = interleaved_ns(arms, ids, a.calls)
        torch.cuda.synchronize()
        fig = {n: added_ns(t, n) for n in arms if n != "bare"}
        out[f"rows_{size}"] = {"bare_median_ns": fig["stream"]["base_median_ns"], **fig}
        print(f"rows {size:3d} bare {fig['stream']['base_median_ns']:.0f} ns; over bare (median ns):",
              {n: round(v["median_ns"]) for n, v in fig.items()}, flush=True)
    out["reader_queries"] = [getattr(tm, "queries", None) for tm in (timer, timer0)]
    out["events_recorded"] = [getattr(tm, "recorded", None) for tm in (timer, timer0)]
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "record_after_copy.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
