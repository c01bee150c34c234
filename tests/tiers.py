"""The test tier a run is in: ``SGLSEAT_TEST_TIER`` as scripts/test.sh sets it (``CI`` or ``full``; unset: CI).

The CI tier (`bash scripts/test.sh`) must fit 20 minutes in a fresh clone on 2 cores; the full tier
(`bash scripts/test.sh --full`) adds the tests marked ``slow`` and, through :func:`by_tier`, the long form of a few
windows whose CI form is shorter but still covers what the test is about (README, "The tests").
"""

from __future__ import annotations

import os

TIER_ENV = "SGLSEAT_TEST_TIER"


def full_tier() -> bool:
    return os.environ.get(TIER_ENV, "").strip().lower() == "full"


def by_tier(ci: float, full: float) -> float:
    """``full`` in the full tier, else ``ci``."""
    return full if full_tier() else ci
