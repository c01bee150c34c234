"""`watch` (filled by the watchdog issue; `replay` lives in cmd_replay.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_seat.cli.common import not_built


def watch() -> None:
    """Live view per rank: state, top frame, row-fetch latency, tokens/s, bundles (not built yet)."""
    not_built("watch", "issue: the watchdog sidecar")


COMMANDS: dict[str, Callable[..., Any]] = {"watch": watch}
