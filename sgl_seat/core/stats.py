"""The statistics that the live watchdog and the offline report both print, defined once.

A p99 in `watch`, in a detector's evidence and in `replay`'s report is the same figure: the nearest-rank
percentile, no interpolation (deterministic, so golden reports stay stable). Row fetches are grouped by gather
size the same way live (the label of the sidecar's exported histogram) and offline (the report's buckets):
powers of two, so a latency that grows with the gather size shows as the same exploding bucket in both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["gather_bucket", "gather_bucket_label", "percentile", "rank_index"]


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0 < q <= 100) by nearest rank: the value at ``ceil(q / 100 * n) - 1`` of the sorted
    values. NaN when there are none."""
    s = sorted(values)
    if not s:
        return math.nan
    return s[rank_index(len(s), q)]


def rank_index(n: int, q: float) -> int:
    """Where :func:`percentile` reads the ``q``-th percentile in ``n`` sorted values (for callers that sort
    a numpy column themselves: a million latencies sort in milliseconds there)."""
    return max(0, min(n - 1, math.ceil(q / 100.0 * n) - 1))


def gather_bucket(size: int) -> tuple[int, int]:
    """The power-of-two bucket ``(lo, hi)`` of a row fetch's gather size: 0 -> (0, 0), 1 -> (1, 1), 5 -> (4, 7),
    100 -> (64, 127); (-1, -1) when the size is unknown (a probe target without a measured argument)."""
    if size < 0:
        return (-1, -1)
    if size == 0:
        return (0, 0)
    b = size.bit_length()
    return (1 << (b - 1), (1 << b) - 1)


def gather_bucket_label(size: int) -> str:
    """The bucket of ``size`` as the exporter's label and the report print it: ``"64-127"``, or ``"unknown"``."""
    lo, hi = gather_bucket(size)
    return "unknown" if lo < 0 else f"{lo}-{hi}"
