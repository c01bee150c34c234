"""Contract tests need SGLang 0.5.23 (scripts/install-sglang-parser.sh): under CI (``CI=true``) a missing
SGLang, or a missing dependency of its sizing path, FAILS the tests that need it; elsewhere they skip."""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


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
