"""The statistics that `watch`, the detectors' evidence and `replay`'s report share (sgl_seat.core.stats)."""

from __future__ import annotations

import math

import pytest

from sgl_seat.core.stats import gather_bucket, gather_bucket_label, percentile


def test_percentile_is_the_nearest_rank_without_interpolation() -> None:
    vals = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted on purpose
    assert percentile(vals, 50) == 3.0  # ceil(0.5 * 5) - 1 = index 2
    assert percentile(vals, 99) == 5.0 and percentile(vals, 100) == 5.0
    assert percentile(vals, 1) == 1.0
    assert percentile(range(1, 101), 99) == 99  # ceil(0.99 * 100) - 1 = index 98, not an interpolated 99.01
    assert percentile([7.0], 50) == 7.0
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("n", [1, 2, 3, 10, 99, 100, 101, 1000])
def test_percentile_returns_a_member_at_or_above_its_share(n: int) -> None:
    vals = list(range(n))
    for q in (50, 90, 99):
        p = percentile(vals, q)
        assert p in vals
        assert sum(v <= p for v in vals) / n >= q / 100.0


def test_gather_buckets_are_powers_of_two_live_and_offline() -> None:
    """The exporter's label and the report's bucket of a gather size are one bucket."""
    sizes = (-1, 0, 1, 2, 3, 5, 64, 127, 128, 200, 16384, 16385)
    assert [gather_bucket(n) for n in sizes] == [(-1, -1), (0, 0), (1, 1), (2, 3), (2, 3), (4, 7), (64, 127),
                                                  (64, 127), (128, 255), (128, 255), (16384, 32767), (16384, 32767)]
    assert [gather_bucket_label(n) for n in (-1, 0, 8, 200)] == ["unknown", "0-0", "8-15", "128-255"]
    for n in range(0, 5000, 7):
        lo, hi = gather_bucket(n)
        assert lo <= n <= hi and gather_bucket(lo) == gather_bucket(hi) == (lo, hi)
