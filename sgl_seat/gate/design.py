"""The battery's design: which arm runs when (ABBA), and the cells each arm run holds.

Why ABBA: a machine drifts (thermals, co-tenants, a page cache warming). Running arm A every time before arm B
would book that drift as an A/B difference; alternating the order (A B, then B A) gives each arm the same mean
position, so a linear drift cancels in the paired ratio. With more arms, even repetitions run the arms in order
and odd ones in reverse, which keeps every arm's mean position equal.

A *slot* is one arm brought up cold (a fresh engine) and measured; its *cells* are the workloads run on it,
cold ones first (TTFT on the long prompt right after the restart, then the greedy set whose identity is only
meaningful after a restart), then the concurrency sweep and the shared-prefix replay. Each cell is a file when
it completes, so an interrupted battery resumes at the first missing cell. On a seat that was not restarted (arms
given by URL) the cold TTFT cell is not measured and greedy identity is marked as not after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ARM_NAMES", "BASELINE", "CANDIDATE", "CONTROL", "HYBRID", "Slot", "cell_names", "schedule"]

BASELINE, CANDIDATE, HYBRID, CONTROL = "baseline", "candidate", "hybrid", "control"
ARM_NAMES = (BASELINE, CANDIDATE, HYBRID, CONTROL)
COLD_CELLS = ("cold_ttft",)  # needs a restart; greedy runs always and records whether it followed one


@dataclass(frozen=True, slots=True)
class Slot:
    """One arm, one repetition: an engine start and the cells measured on it."""

    rep: int
    arm: str
    position: int  # order within the whole battery (0-based)

    @property
    def key(self) -> str:
        return f"r{self.rep:02d}-{self.arm}"


def schedule(arms: Sequence[str], runs: int) -> list[Slot]:
    """ABBA order: repetition 0 runs ``arms`` in order, repetition 1 in reverse, and so on."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if len(set(arms)) != len(arms) or not arms:
        raise ValueError(f"arms must be distinct and non-empty, got {list(arms)}")
    out: list[Slot] = []
    for rep in range(runs):
        order = list(arms) if rep % 2 == 0 else list(reversed(arms))
        for arm in order:
            out.append(Slot(rep, arm, len(out)))
    return out


def cell_names(levels: Sequence[int]) -> list[str]:
    """A slot's cells in the order they run: what the engine reports, the cold cells, the sweep by concurrency,
    the prefix replay, and last the bundles the watchdog captured during the slot."""
    return ["engine", *COLD_CELLS, "greedy", *(f"sweep_c{c}" for c in levels), "prefix", "hangs"]
