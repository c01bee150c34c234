"""Which part of the C graph path aborts a process at exit (issue 25, docs/gpu-validation.md): one variant per run.

    python3 bench/gpu/exit_repro.py native|pywrapper|pytimer|notimer|disable|replace; echo $?

Each variant captures one CUDA graph, wraps a backend's ``replay`` with the probe's graph wrapper and replays it
200 times: ``native`` (C wrapper, C timer), ``pywrapper`` (Python wrapper, C timer), ``pytimer`` (C wrapper,
Python timer), ``notimer`` (host timing only), ``disable`` (the timer stopped before exit), ``replace`` (the
process's timer replaced six times, as bench/gpu/graph_cost.py replaces it between its arms).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

from sgl_seat import probe
from sgl_seat.probe import graph


def main() -> int:
    variant = sys.argv[1]
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="exit-", dir="/dev/shm")
    os.environ["SGLSEAT_PROBE_GPU"] = "0"
    os.environ[graph.ENV_GRAPH] = "0" if variant == "notimer" else "auto"
    torch.cuda.init()
    x = torch.randn(64, 64, device="cuda")
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x @ x
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(g):
        x @ x

    class Backend:
        def replay(self, shape_key: int, forward_batch: object) -> None:
            g.replay()

    spec = probe.parse_target("m:Backend.replay@shape_key:graph")
    wrapped = graph.make_graph_wrapper(Backend.replay, spec, python=variant == "pywrapper")
    backend = Backend()
    if variant == "pytimer":
        graph._NATIVE_ALLOWED = False
    for _ in range(6 if variant == "replace" else 1):
        graph.disable_graph()
        for _ in range(200):
            wrapped(backend, 4, None)
    torch.cuda.synchronize()
    print(variant, "timer:", type(graph.replay_timer()).__name__, "path:", graph.graph_path(), flush=True)
    if variant == "disable":
        graph.disable_graph()
    print("exiting", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
