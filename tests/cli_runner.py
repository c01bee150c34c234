"""Run the real `sgl-seat` entry point in-process, as a shell would, and return its exit code."""

from __future__ import annotations

import sys

import pytest

from sgl_seat.cli.main import main


def run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``sgl-seat *argv`` through ``main()`` (so SeatErrors print as users see them); the exit code."""
    monkeypatch.setattr(sys, "argv", ["sgl-seat", *argv])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
