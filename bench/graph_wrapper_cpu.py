"""CPU-only: the graph-replay wrapper's host cost per call around a fake replay, C and Python wrappers (issue 25).

No GPU: host timing only (no replay timer), plus the Python reader's cost per replay it resolves
(``ReplayTimer.poll`` over fake events that completed), the work that landed on the replaying thread through the
GIL on the H200. Blocks of ``--calls`` calls, arms interleaved; ns per call: median (min-max) over blocks, minus
the bare call. ``python bench/graph_wrapper_cpu.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class ShapeKey:
    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class Runner:
    captured_req_width = 4
    ragged_verify_mode = False


class Backend:
    def __init__(self) -> None:
        self._cuda_graph_runner = Runner()

    def replay(self, shape_key: ShapeKey, static_forward_batch: object) -> None:
        return None


class Ev:
    __slots__ = ()

    def record(self) -> None:
        return None

    def query(self) -> bool:
        return True


def main() -> int:
    os.environ["SGLSEAT_PROBE_DIR"] = tempfile.mkdtemp(prefix="graph-cpu-")
    os.environ["SGLSEAT_PROBE_GPU"] = "0"
    os.environ["SGLSEAT_PROBE_GRAPH"] = "0"
    calls, rounds = 20000, 25
    from sgl_seat import probe
    from sgl_seat.probe import graph, writer

    spec = probe.parse_target("bench_cpu:Backend.replay@shape_key:graph")
    arms = {"bare": Backend.replay, "native": graph.make_graph_wrapper(Backend.replay, spec),
            "python": graph.make_graph_wrapper(Backend.replay, spec, python=True)}
    print("writer:", writer.native_state(), "| native arm:", type(arms["native"]).__name__)
    b, key = Backend(), ShapeKey(8)
    for fn in arms.values():
        fn(b, key, None)
    res: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(rounds):
        for name, fn in arms.items():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn(b, key, None)
            res[name].append((time.perf_counter_ns() - t0) / calls)
    for name in ("native", "python"):
        d = [w - x for w, x in zip(res[name], res["bare"], strict=True)]
        print(f"{name:7s} host-only added ns/call: median {statistics.median(d):.0f} (min {min(d):.0f}, "
              f"max {max(d):.0f}); bare {statistics.median(res['bare']):.0f}")
    # The Python reader's work per replay it resolves (it holds the GIL throughout).
    graph.disable_graph()
    timer = graph.enable_graph(Ev, lambda: False, start_thread=False)
    assert timer is not None
    per: list[float] = []
    for _ in range(rounds):
        for _ in range(1000):
            arms["python"](b, key, None)
        t0 = time.perf_counter_ns()
        timer.poll()
        per.append((time.perf_counter_ns() - t0) / 1000)
    print(f"python reader: ns per replay resolved (fake events, no CUDA query): median {statistics.median(per):.0f} "
          f"(min {min(per):.0f}, max {max(per):.0f})")
    graph.disable_graph()
    return 0


if __name__ == "__main__":
    sys.exit(main())
