"""Unit tests size with the mirror: no SGLang child process (unit tests start none), and figures that do not
depend on whether SGLang is installed. tests/contract holds the mirror to SGLang's own code."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _size_with_the_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGL_SEAT_SIZING", "mirror")
