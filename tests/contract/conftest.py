"""Contract tests need SGLang 0.5.23 (scripts/install-sglang-parser.sh): under CI (``CI=true``) a missing
SGLang, or a missing dependency of its sizing path, FAILS the tests that need it; elsewhere they skip.

scripts/test.sh runs them beside the unit tests with ``-n 2 --dist loadfile``: a module stays on one worker, so its
module fixtures (SGLang's sizing of a whole grid, one sizing child) are computed once. (``--dist loadgroup`` with an
``xdist_group`` mark did not group here, pytest-xdist 3.8.0 under pytest 9.2: the sizing grids were computed on both
workers, 80 s each.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


#: The bound on a contract test's child (SGLang's or vLLM's imports, a sizing grid): a hang's, not a timing. The unit
#: and contract tests run at niceness 10 beside the integration streams (scripts/test.sh), and on a saturated 2-core
#: box a child that imports SGLang got so little of the CPU that it passed 240 s (the CI run of 2026-12-06 19:28).
CHILD_S = 900


def require(available: bool, why: str) -> None:
    """Fail under CI, skip elsewhere, when a contract test's prerequisite is missing."""
    if available:
        return
    if in_ci():
        pytest.fail(f"CI=true and {why}: the contract tests must run in CI (scripts/install-sglang-parser.sh)")
    pytest.skip(why)


@pytest.fixture
def sglang_required() -> None:
    from tests.contract.sglang_parser import sglang_available

    require(sglang_available(), "SGLang 0.5.23's parser cannot be imported")


@pytest.fixture(scope="module", autouse=True)
def _one_sizing_child_per_module() -> Iterator[None]:
    """SGLang's imports cost seconds: a contract module's many plans share one sizing child, stopped after it."""
    from sgl_seat.sizing import CACHE_ENV, sizing_session

    # Contract tests compare against SGLang's code run now, never against answers kept from an earlier run
    # (the cache's own contract test turns it back on in a temporary home).
    saved = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = "off"
    try:
        with sizing_session():
            yield
    finally:
        if saved is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = saved
