"""What recording a CUDA event costs from Python, by way of recording it (ns per call, min over batches).

Why: the probe records an event per wrapped call on the hot path (two before the one-event design);
``torch.cuda.Event.record()`` builds a Python ``Stream`` object for the current stream each time. This compares
it with the raw paths the probe can use (``probe.cuda_paths``), and checks that the probe turns GPU timing on by
itself (auto mode) in a process that initialised CUDA.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def per_call(fn, batches: int = 100, n: int = 1000) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(batches):
        best = min(best, timeit.timeit(fn, number=n) / n)
        torch.cuda.synchronize()
    return round(best * 1e9, 1)


def main() -> None:
    torch.zeros(1, device="cuda")
    ev = torch.cuda.Event(enable_timing=True)
    dev = torch.cuda.current_device()
    out = {
        "Event.record()": per_call(lambda: ev.record()),
        "is_current_stream_capturing()": per_call(torch.cuda.is_current_stream_capturing),
        "torch._C._cuda_isCurrentStreamCapturing()": per_call(torch._C._cuda_isCurrentStreamCapturing),
        "torch._C._cuda_getCurrentRawStream(dev)": per_call(lambda: torch._C._cuda_getCurrentRawStream(dev)),
        "torch.cuda.current_device()": per_call(torch.cuda.current_device),
    }
    try:
        rt = ctypes.CDLL("libcudart.so.13")
        rec = rt.cudaEventRecord
        rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        handle = ev.cuda_event
        raw = torch._C._cuda_getCurrentRawStream
        out["ctypes cudaEventRecord(ev, raw stream)"] = per_call(lambda: rec(handle, raw(dev)))
        plain = torch.cuda.Event()  # no timing: what the one-event probe records
        plain.record()
        ph = plain.cuda_event
        out["ctypes cudaEventRecord(plain ev, raw stream)"] = per_call(lambda: rec(ph, raw(dev)))
    except OSError as exc:
        out["ctypes"] = f"unavailable: {exc}"
    cur = torch.cuda.current_stream()
    base_record = torch._C._CudaEventBase.record
    plain2 = torch.cuda.Event()
    plain2.record()
    out["_CudaEventBase.record(timing ev, cached stream)"] = per_call(lambda: base_record(ev, cur))
    out["_CudaEventBase.record(plain ev, cached stream)"] = per_call(lambda: base_record(plain2, cur))
    out["plain ev.query() (completed)"] = per_call(plain2.query)
    from sgl_seat import probe as _probe

    for how in ("method", "ctypes", "base"):  # the probe's own record paths, stream key included
        paths = _probe.cuda_paths(torch, how)
        item = paths.factory()
        out[f"probe record path {how!r}"] = per_call(lambda paths=paths, item=item: paths.record(item))
    hooks = _probe.gpu._graph_capture_hooks(torch)
    if hooks is not None:
        out["capture test through the CUDAGraph hooks"] = per_call(hooks)
    # The probe in auto mode, as an engine process uses it.
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp()
    from sgl_seat import probe

    def fetch(table: object, ids: object) -> None:
        torch.cuda._sleep(1000)

    w = probe.make_wrapper(fetch, probe.parse_target("x:fetch@"))
    w(None, None)
    w(None, None)
    timer = probe.gpu_timer()
    out["auto_mode_timer"] = repr(timer)
    out["cuda_initialized"] = torch.cuda.is_initialized()
    torch.cuda.synchronize()
    if timer is not None:
        timer.poll()
    from sgl_seat.core.records import ProbeRecord

    path = probe.ring_file()
    out["ring_records"] = [r.to_json() for r in probe.read_ring(path, record=ProbeRecord)] if path else None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
