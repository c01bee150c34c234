"""The host-side embedding row fetch: one named function the watchdog's probe wraps.

Why: on the DeepSeek-V4.1 Engram seats every target forward gathers rows of a large host-memory table
(gather size = running requests x positions per request, so it grows with the draft), and that host read is
the suspected hang site. The sim does the same shape of work, for real: ``torch.index_select`` on a CPU
table of realistic width, every step, through :func:`fetch_rows` only.

Contract with the probe: schedulers call ``rowfetch.fetch_rows(...)`` through this module's attribute, so
replacing ``sgl_seat.sim.rowfetch.fetch_rows`` (monkeypatching) wraps every call. An injected row-fetch
stall waits *inside* :func:`fetch_rows`'s own frame, so a stack sample of a stalled rank shows
``fetch_rows`` at the top and a probe sees the fetch in flight.

CUDA mode (:func:`use_cuda`, from ``--device cuda``): the table lives in pinned host memory, the gather goes
into a pinned staging buffer and is copied to the rank's GPU (non-blocking), all inside :func:`fetch_rows`.
An armed *GPU* stall (:func:`arm_gpu_stall`) enqueues a spin kernel on the current stream inside this frame,
before the copy: the call returns at once and its CPU thread runs on, while the rows never arrive on the GPU
for the stall's length (the shape of a UVA read of a host table that stalls inside a kernel). Only the
probe's CUDA event after the call sees it.
"""

from __future__ import annotations

import math
import time

import torch

from sgl_seat.sim.args import DEFAULT_TABLE_ROWS as DEFAULT_ROWS
from sgl_seat.sim.step.device import FOREVER_S, spin

ROW_WIDTH = 7168  # DeepSeek-V3/V4 hidden size
DTYPE = torch.bfloat16
_POLL_S = 0.05

# Monotonic deadline of an armed stall (math.inf: until the process dies), or None.
_stall_until: float | None = None
# CUDA mode: the rank's device, the pinned staging buffer, the spin rate; and an armed GPU stall's seconds.
_device: torch.device | None = None
_staging: torch.Tensor | None = None
_cycles_per_s = 0.0
_gpu_stall_s: float | None = None


def make_table(rows: int = DEFAULT_ROWS, width: int = ROW_WIDTH, seed: int = 0) -> torch.Tensor:
    """The host table: deterministic values, contiguous, in the model's dtype."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand((rows, width), generator=gen, dtype=torch.float32).to(DTYPE)


def make_ids(seed: int, size: int, rows: int) -> torch.Tensor:
    """The step's row ids: they vary step to step (hashed n-gram ids look random)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (size,), generator=gen, dtype=torch.int64)


def arm_stall(seconds: float | None) -> None:
    """Make the next :func:`fetch_rows` call wait ``seconds`` (None: until the process dies)."""
    global _stall_until
    _stall_until = math.inf if seconds is None else time.monotonic() + seconds


def clear_stall() -> None:
    global _stall_until, _gpu_stall_s
    _stall_until = None
    _gpu_stall_s = None


def stalled() -> bool:
    return _stall_until is not None


def use_cuda(device: torch.device, cycles_per_s: float, max_rows: int, width: int = ROW_WIDTH) -> None:
    """CUDA mode: rows are copied to ``device`` through a pinned staging buffer of ``max_rows`` rows."""
    global _device, _staging, _cycles_per_s
    _device = device
    _staging = torch.empty((max_rows, width), dtype=DTYPE).pin_memory()
    _cycles_per_s = cycles_per_s


def pin_table(table: torch.Tensor) -> torch.Tensor:
    """The host table in pinned (page-locked) memory, as a host table read by the GPU is."""
    return table.pin_memory()


def arm_gpu_stall(seconds: float | None) -> None:
    """Make the next :func:`fetch_rows` stall its GPU stream ``seconds`` (None: about an hour)."""
    global _gpu_stall_s
    _gpu_stall_s = FOREVER_S if seconds is None else seconds


def fetch_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gather ``table[ids]`` (rows x width). An armed stall waits here, in this frame, until it ends.

    In CUDA mode the rows come back on the GPU, and an armed GPU stall spins the stream here instead.
    """
    global _stall_until, _gpu_stall_s
    while _stall_until is not None:
        if time.monotonic() >= _stall_until:
            _stall_until = None
            break
        time.sleep(_POLL_S)
    if _device is None or _staging is None:
        return torch.index_select(table, 0, ids)
    if _gpu_stall_s is not None:
        seconds, _gpu_stall_s = _gpu_stall_s, None
        spin(seconds, _cycles_per_s)
    n = int(ids.numel())
    staged = _staging[:n]
    torch.index_select(table, 0, ids, out=staged)
    return staged.to(_device, non_blocking=True)
