"""`watch` and `replay` (filled by the watchdog and forensics issues)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_seat.cli.common import not_built


def watch() -> None:
    """Live view per rank: state, top frame, row-fetch latency, tokens/s, bundles (not built yet)."""
    not_built("watch", "issue: the watchdog sidecar")


def replay() -> None:
    """Verify a bundle, re-run the detectors and report the hang offline (not built yet)."""
    not_built("replay", "issue: forensic bundles and offline replay")


COMMANDS: dict[str, Callable[..., Any]] = {"watch": watch, "replay": replay}
