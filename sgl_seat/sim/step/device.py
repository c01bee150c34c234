"""The sim on real GPUs (``--device cuda``): each rank on its own GPU, NCCL, a matmul per step.

Why: the hang this toolkit exists for happens inside GPU work. SGLang's Engram host table is read by a kernel
over UVA, so a stalled host read stalls a *kernel*: the rank's CPU thread runs on into the all-reduce and the
device sync exactly like its peers, and stacks cannot tell them apart (measured on two H200s, see
../shared/reference/gpu-observations.md). On CPU (``--device cpu``, the default) nothing here runs and the
sim stays what it was: gloo and host work only.

What CUDA mode does per rank:

- picks its GPU: the rank's index among its node's ranks, modulo the GPUs the process sees (Ray gives each
  simulated node its GPUs through ``CUDA_VISIBLE_DEVICES``), and sets it before NCCL starts;
- keeps the row table in pinned host memory; :func:`sgl_seat.sim.rowfetch.fetch_rows` gathers on the host
  into a pinned staging buffer and copies the rows to the GPU (non-blocking), inside its own frame;
- runs one matmul per step on the fetched rows (``gather x 7168 @ 7168 x 1024``, bf16: real GPU work whose
  size follows the step's gather, which the cost model sets);
- after the all-reduce, synchronises the device, as a step's end does in a real engine.

The kernel-side stall (``gpu-stall`` fault): ``torch.cuda._sleep`` spins the rank's current stream inside
``fetch_rows`` for the stall's length; it stands in for a UVA read of the host table that does not return
(no Triton kernel over a host-registered buffer is built here). The CPU thread is not held.
"""

from __future__ import annotations

import os

import torch

CPU = "cpu"
CUDA = "cuda"
DEVICES: tuple[str, ...] = (CPU, CUDA)
MATMUL_OUT = 1024
#: A stall "until the process dies": one hour of spinning, re-armed never (the process is torn down first).
FOREVER_S = 3600.0


def local_gpu(tp_rank: int, ranks_per_node: int, visible: int) -> int:
    """The GPU index (among the visible ones) for ``tp_rank``: its index on its node, modulo ``visible``."""
    if visible < 1:
        raise RuntimeError("CUDA mode needs at least one visible GPU (check CUDA_VISIBLE_DEVICES and the node's "
                           "GPU bundle)")
    return (tp_rank % max(1, ranks_per_node)) % visible


class CudaRank:
    """One rank's GPU state: its device, the matmul weight, the spin-loop calibration."""

    def __init__(self, tp_rank: int, ranks_per_node: int) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device here "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})")
        self.index = local_gpu(tp_rank, ranks_per_node, torch.cuda.device_count())
        torch.cuda.set_device(self.index)
        self.device = torch.device(CUDA, self.index)
        gen = torch.Generator(device=self.device).manual_seed(1000 + tp_rank)
        self.weight = torch.randn((7168, MATMUL_OUT), generator=gen, device=self.device, dtype=torch.bfloat16)
        self.cycles_per_s = calibrate_sleep(self.device)

    def compute(self, rows: torch.Tensor) -> torch.Tensor:
        """The step's GPU work on the fetched rows (empty gather: nothing to do)."""
        if rows.numel() == 0:
            return rows
        return rows @ self.weight

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


def calibrate_sleep(device: torch.device, cycles: int = 20_000_000) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep`` on ``device`` (one short timed spin)."""
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    _sleep(1000)  # warm the kernel
    start.record()
    _sleep(cycles)
    end.record()
    end.synchronize()
    ms = float(start.elapsed_time(end))
    return cycles / max(ms / 1e3, 1e-6)


def _sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: a kernel that spins ``cycles`` GPU clock cycles (torch's own test helper)."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]


def spin(seconds: float, cycles_per_s: float) -> None:
    """Enqueue one GPU spin of about ``seconds`` on the current stream; the CPU returns at once.

    One kernel (an int64 cycle count: an hour is ~7e12 cycles at 2 GHz), not many short ones: a full launch
    queue would block the host thread, and the point is that it does not block.
    """
    _sleep(max(1, int(seconds * cycles_per_s)))
