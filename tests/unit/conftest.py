"""Unit tests size with the mirror: no SGLang child process (unit tests start none), and figures that do not
depend on whether SGLang is installed. tests/contract holds the mirror to SGLang's own code."""

from __future__ import annotations

import pytest

from sgl_seat import probe


@pytest.fixture(autouse=True)
def _size_with_the_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")


def probe_writer(writer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's ring writer: the C one (``probe_native.c``, the default where it builds) or the Python one.
    Targets installed by an earlier test are forgotten (install is idempotent per target: a module made anew
    under the same name would not be wrapped)."""
    probe.reset()
    monkeypatch.setattr(probe.installer, "_INSTALLED", {})
    monkeypatch.setattr(probe.installer, "_PENDING", {})
    if writer == "python":
        monkeypatch.setattr(probe.writer, "_NATIVE", None)
        monkeypatch.setattr(probe.writer, "_NATIVE_DECIDED", True)
    elif probe.writer._native() is None:
        pytest.skip(f"no C writer here: {probe.native_state()}")  # test_native_writer_builds_here says why
