"""What stack sampling costs a GPU decode loop: ABBA windows, sampler off vs on, ratio with a 95 % interval.

Why a loop of its own: the sim's step time is its cost model's sleep, so sampling that takes CPU from a sim rank
only eats slack and its throughput cannot show a cost. Here each rank runs decode-shaped steps back to back with no
sleep: the sim's real ``fetch_rows`` in CUDA mode (host gather of ``--gather`` rows into pinned staging, copy to
its GPU), wrapped by the probe (GPU-stream timing on, as in an engine), ``--layers`` bf16 matmuls of
``gather x 7168 @ 7168 x 7168`` (distinct weights, launched one by one, no CUDA graph), an NCCL all-reduce and a
device sync. Every rank process is titled
``sglang::scheduler_TP<r>_EP<r>`` (as SGLang's are), and the watchdog's own :class:`Sampler` dumps each of them
with ``py-spy --nonblocking`` at the rate under test, exactly what a sidecar does per engine process. Ranks of
simulated node ``n`` see GPUs ``n*G .. n*G+G-1`` (``CUDA_VISIBLE_DEVICES``), as on a seat.

Windows go in ABBA quads (off, on, on, off) so a linear drift hits both arms alike; each quad gives one ratio
(steps on / steps off), and the printed interval is Student t over the quads. Synthetic workload, real GPUs::

    python bench/gpu/decode_loop.py --nodes 2 --gpus-per-node 1 --hz 1,5 --quads 10 --window 4 --out /tmp/o
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TARGET = "sgl_seat.sim.rowfetch:fetch_rows@ids:numel"
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def rank_main(a: argparse.Namespace) -> int:
    """One rank: decode-shaped steps until SIGTERM, counting them in its word of the counter file."""
    import torch
    import torch.distributed as dist

    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(f"sglang::scheduler_TP{a.rank}_EP{a.rank}")
    from sgl_seat import probe
    from sgl_seat.sim import rowfetch

    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    local = a.rank % a.gpus_per_node
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.set_num_threads(1)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world)
    rowfetch.use_cuda(dev, cycles_per_s=1e9, max_rows=a.gather)
    table = rowfetch.pin_table(rowfetch.make_table(seed=a.rank))
    weights = [torch.randn((7168, 7168), device=dev, dtype=torch.bfloat16) * 0.01 for _ in range(a.layers)]
    red = torch.zeros(8, device=dev)
    probe.install([TARGET])  # after CUDA is up: auto mode turns GPU-stream timing on
    with open(a.counter, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
    counts = memoryview(mm).cast("q")
    step = 0
    while not stop:
        ids = rowfetch.make_ids(step, a.gather, table.shape[0])
        x = rowfetch.fetch_rows(table, ids)
        for w in weights:
            x = x @ w
        red[:1].copy_(x[0, :1].float())
        dist.all_reduce(red)
        torch.cuda.synchronize(dev)
        step += 1
        counts[a.rank] = step
    dist.destroy_process_group()
    return 0


def run(a: argparse.Namespace) -> dict[str, Any]:
    from watchdog_overhead import abba_ratios, mean_ci95

    from sgl_seat.netports import any_free_port
    from sgl_seat.watchdog.procfind import EngineProc
    from sgl_seat.watchdog.sampler import Sampler

    world = a.nodes * a.gpus_per_node
    work = Path(a.out or "/tmp/decode-loop")
    work.mkdir(parents=True, exist_ok=True)
    counter = work / "counts.bin"
    counter.write_bytes(b"\0" * 8 * max(world, 8))
    port = any_free_port()
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, Any] = {"nodes": a.nodes, "gpus_per_node": a.gpus_per_node, "gather": a.gather,
                           "layers": a.layers, "window_s": a.window, "quads": a.quads}
    try:
        for r in range(world):
            node = r // a.gpus_per_node
            gpus = ",".join(str(node * a.gpus_per_node + i) for i in range(a.gpus_per_node))
            env = {**os.environ, **NCCL_ENV, "CUDA_VISIBLE_DEVICES": gpus, "SGLSEAT_RANK": str(r),
                   "SGLSEAT_PROBE_DIR": str(work / "rings"),
                   "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), "--world", str(world), "--port", str(port),
                 "--gpus-per-node", str(a.gpus_per_node), "--gather", str(a.gather), "--layers", str(a.layers),
                 "--counter", str(counter)], env=env, stdin=subprocess.DEVNULL,
                stdout=open(work / f"rank{r}.log", "wb"), stderr=subprocess.STDOUT))  # noqa: SIM115
        with open(counter, "r+b") as fh:
            mm = mmap.mmap(fh.fileno(), 0)
        counts = memoryview(mm).cast("q")
        deadline = time.monotonic() + 180
        while min(counts[r] for r in range(world)) < 50:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("ranks did not start: " + (work / "rank0.log").read_text()[-2000:])
            time.sleep(0.2)
        time.sleep(a.warmup)
        import psutil

        eprocs = [EngineProc(pid=p.pid, title=f"sglang::scheduler_TP{r}_EP{r}", rank=r, kind="scheduler",
                             create_time=psutil.Process(p.pid).create_time()) for r, p in enumerate(procs)]

        def window() -> float:
            c0, t0 = counts[0], time.monotonic()
            time.sleep(a.window)
            return (counts[0] - c0) / (time.monotonic() - t0)

        for hz in [float(x) for x in a.hz.split(",") if x]:
            off: list[float] = []
            on: list[float] = []
            samples = 0
            for q in range(a.quads):
                off.append(window())
                sampler = Sampler(node=0, sample_hz=hz, discover=lambda: eprocs)
                sampler.start()
                time.sleep(1.0)  # sampling before the window opens
                on.append(window())
                on.append(window())
                sampler.stop()
                samples += sampler.samples_taken
                time.sleep(1.0)  # the same gap after the stop
                off.append(window())
                print(f"  {hz:g} Hz quad {q + 1}: off {off[-2]:.1f} on {on[-2]:.1f} {on[-1]:.1f} off {off[-1]:.1f} "
                      "steps/s", file=sys.stderr, flush=True)
            ratios = abba_ratios(off, on)
            m, lo, hi = mean_ci95(ratios)
            offs_mean = sum(off) / len(off)
            out[f"{hz:g} Hz"] = {"off_steps_per_s": off, "on_steps_per_s": on, "ratios": ratios, "mean": m,
                                 "ci95": [lo, hi], "off_spread": (max(off) - min(off)) / offs_mean,
                                 "samples_taken": samples, "sampler_pyspy": sampler.pyspy,
                                 "sampler_errors": sampler.errors}
            print(json.dumps({f"{hz:g} Hz": {k: v for k, v in out[f'{hz:g} Hz'].items()
                                             if k in ("mean", "ci95", "off_spread", "samples_taken")}}), flush=True)
        return out
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--gather", type=int, default=32, help="rows per fetch (the field report's largest: 32)")
    ap.add_argument("--layers", type=int, default=60,
                    help="matmuls per step (60: a 60-layer, 7168-wide model's weights read once per step, memory-bound "
                         "like a real decode step; each rank holds 6 GB of them)")
    ap.add_argument("--hz", default="1,5")
    ap.add_argument("--quads", type=int, default=10)
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    # rank processes
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--world", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--counter", default="")
    a = ap.parse_args()
    if a.rank is not None:
        return rank_main(a)
    res = run(a)
    if a.out:
        (Path(a.out) / "decode_loop.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
