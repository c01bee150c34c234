"""The statistics that the live watchdog and the offline report both print, defined once.

A p99 in `watch`, in a detector's evidence and in `replay`'s report is the same figure: the nearest-rank
percentile, no interpolation (deterministic, so golden reports stay stable).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 < q <= 100) by nearest rank: the value at ``ceil(q / 100 * n) - 1`` of the sorted
    values. NaN when there are none."""
    s = sorted(values)
    if not s:
        return math.nan
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]
