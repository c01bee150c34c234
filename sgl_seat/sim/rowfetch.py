"""The host-side embedding row fetch: one named function the watchdog's probe wraps.

Why: on the DeepSeek-V4.1 Engram seats every target forward gathers rows of a large host-memory table
(gather size = running requests x positions per request, so it grows with the draft), and that host read is
the suspected hang site. The sim does the same shape of work, for real: ``torch.index_select`` on a CPU
table of realistic width, every step, through :func:`fetch_rows` only.

Contract with the probe: schedulers call ``rowfetch.fetch_rows(...)`` through this module's attribute, so
replacing ``sgl_seat.sim.rowfetch.fetch_rows`` (monkeypatching) wraps every call. An injected row-fetch
stall waits *inside* :func:`fetch_rows`'s own frame, so a stack sample of a stalled rank shows
``fetch_rows`` at the top and a probe sees the fetch in flight.
"""

from __future__ import annotations

import math
import time

import torch

from sgl_seat.sim.args import DEFAULT_TABLE_ROWS as DEFAULT_ROWS

ROW_WIDTH = 7168  # DeepSeek-V3/V4 hidden size
DTYPE = torch.bfloat16
_POLL_S = 0.05

# Monotonic deadline of an armed stall (math.inf: until the process dies), or None.
_stall_until: float | None = None


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
    global _stall_until
    _stall_until = None


def stalled() -> bool:
    return _stall_until is not None


def fetch_rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gather ``table[ids]`` (rows x width). An armed stall waits here, in this frame, until it ends."""
    global _stall_until
    while _stall_until is not None:
        if time.monotonic() >= _stall_until:
            _stall_until = None
            break
        time.sleep(_POLL_S)
    return torch.index_select(table, 0, ids)
