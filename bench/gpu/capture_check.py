"""The probe's event paths and CUDA graph capture, checked on a GPU (each case in its own process).

Why: SGLang captures CUDA graphs at start-up and the probe's wrapped functions run during capture; an event
recorded into a captured stream, or a query from the probe's reader thread while another thread captures in
torch's default (global) mode, could break the capture. Cases (``--case``, or all, each in a child process):

- ``record``: a ctypes ``cudaEventRecord`` and a ``_CudaEventBase.record`` of a plain event on the capturing
  stream, inside ``torch.cuda.graph`` (what a probe without a capture test would do): does the capture succeed,
  does the replay compute the right thing, what does a later query of that event say?
- ``query-global`` / ``query-relaxed``: a side thread queries a completed event in a loop while the main thread
  captures (global mode); without / with ``cudaThreadExchangeStreamCaptureMode(relaxed)`` in that thread
  (what the probe's reader thread does first).
- ``probe``: the probe itself (CUDAGraph hooks, reader thread running with calls pending) around a function
  called during capture: no event recorded in the capture, the capture and replay fine, timing resumes after.

    python bench/gpu/capture_check.py [--case NAME] [--out DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
CASES = ("record", "query-global", "query-relaxed", "probe")


def _graph_of(torch: Any, body: Any) -> tuple[Any, Any, Any]:
    """Capture ``body(x)`` (x: a GPU tensor) with torch.cuda.graph; returns (graph or None, x, error text)."""
    x = torch.ones(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body(x)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            body(x)
        return g, x, None
    except Exception as exc:
        return None, x, f"{type(exc).__name__}: {str(exc)[:300]}"


def case_record(torch: Any) -> dict[str, Any]:
    rt = ctypes.CDLL("libcudart.so.13")
    rec = rt.cudaEventRecord
    rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rec.restype = ctypes.c_int
    out: dict[str, Any] = {}
    for how in ("ctypes", "base"):
        ev = torch.cuda.Event()
        ev.record()
        torch.cuda.synchronize()
        codes: list[Any] = []

        def body(x: Any, ev: Any = ev, how: str = how, codes: list[Any] = codes) -> None:
            x.mul_(2.0)
            if torch.cuda.is_current_stream_capturing():
                if how == "ctypes":
                    codes.append(rec(ev.cuda_event, torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())))
                else:
                    torch._C._CudaEventBase.record(ev, torch.cuda.current_stream())
                    codes.append(0)
            x.add_(1.0)

        g, x, err = _graph_of(torch, body)
        r: dict[str, Any] = {"capture_error": err, "record_return_codes": codes}
        if g is not None:
            x.fill_(1.0)
            g.replay()
            torch.cuda.synchronize()
            r["replay_value"] = float(x[0])  # 1 * 2 + 1 = 3
            try:
                r["query_after"] = bool(ev.query())
            except Exception as exc:
                r["query_after"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out[how] = r
    return out


def case_query(torch: Any, relaxed: bool) -> dict[str, Any]:
    rt = ctypes.CDLL("libcudart.so.13")
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    stop = threading.Event()
    seen: dict[str, Any] = {"queries": 0, "errors": []}

    def reader() -> None:
        if relaxed:
            mode = ctypes.c_int(2)
            seen["exchange_rc"] = rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        while not stop.is_set():
            try:
                ev.query()
                seen["queries"] += 1
            except Exception as exc:
                if len(seen["errors"]) < 3:
                    seen["errors"].append(f"{type(exc).__name__}: {str(exc)[:200]}")
            time.sleep(0)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    time.sleep(0.05)

    def body(x: Any) -> None:
        for _ in range(200):
            x.mul_(1.0001)
            time.sleep(0)  # let the reader run between the kernels captured

    before = seen["queries"]
    g, _x, err = _graph_of(torch, body)
    during = seen["queries"] - before
    stop.set()
    th.join(2)
    out = {"relaxed": relaxed, "capture_error": err, "reader_queries_during_capture": during,
           "reader_errors": seen["errors"], "exchange_rc": seen.get("exchange_rc")}
    if g is not None:
        g.replay()
        torch.cuda.synchronize()
        out["replay_ok"] = True
    return out


def case_probe(torch: Any) -> dict[str, Any]:
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="capture-check-")
    os.environ["SGLSEAT_PROBE_GPU"] = "0"
    from sgl_seat import probe

    def fetch(table: object, ids: Any) -> None:
        ids.mul_(1.0)

    w = probe.make_wrapper(fetch, probe.parse_target("cc:fetch@ids:none"))
    w(None, torch.ones(4, device="cuda"))
    timer = probe.enable_gpu_cuda(torch, probe.DEFAULT_GPU_PATH)
    assert timer is not None
    torch.cuda._sleep(int(2e9))  # keep calls pending while the capture runs, so the reader queries throughout
    for _ in range(50):
        w(None, torch.ones(4, device="cuda"))
    queued_before = timer._queued

    def body(x: Any) -> None:
        for _ in range(20):
            w(None, x)
            time.sleep(0.001)

    g, _x, err = _graph_of(torch, body)
    queued_after_capture = timer._queued
    out: dict[str, Any] = {"capture_error": err, "queued_before": queued_before,
                           "queued_after_capture": queued_after_capture}
    if g is not None:
        g.replay()
    torch.cuda.synchronize()
    w(None, torch.ones(4, device="cuda"))
    time.sleep(0.5)
    torch.cuda.synchronize()
    time.sleep(0.5)
    recs = probe.read_ring(probe.ring_file() or "")
    out.update(timer_errors=timer.errors, reader_queries=timer.queries, records=len(recs),
               records_with_gpu=sum(r.gpu for r in recs), records_gpu_done=sum(r.gpu_end is not None for r in recs),
               capture_count_after=probe.gpu._CAPTURES[0])
    return out


def run_case(name: str) -> dict[str, Any]:
    import torch

    torch.zeros(1, device="cuda")
    if name == "record":
        return case_record(torch)
    if name in ("query-global", "query-relaxed"):
        return case_query(torch, relaxed=name == "query-relaxed")
    if name == "probe":
        return case_probe(torch)
    raise SystemExit(f"unknown case {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default=None, choices=CASES)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.case:
        print(json.dumps(run_case(a.case)), flush=True)
        return 0
    res: dict[str, Any] = {}
    for name in CASES:
        p = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, timeout=120,
                           check=False)
        lines = p.stdout.strip().splitlines()
        try:
            res[name] = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            res[name] = None
        if p.returncode or res[name] is None:
            res[name] = {"rc": p.returncode, "stdout": p.stdout[-800:], "stderr": p.stderr[-1500:], "parsed": res[name]}
        print(name, json.dumps(res[name]), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "capture_check.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
