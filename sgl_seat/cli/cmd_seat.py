"""`up`, `down`, `status`, `logs`, `demo`: the seat's life cycle (filled by the up/down issue)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sgl_seat.cli.common import not_built


def up() -> None:
    """Bring a seat up across its nodes through a Ray placement group (not built yet)."""
    not_built("up", "issue: up / down / status / logs")


def down() -> None:
    """Take a seat down on every node and check nothing is left (not built yet)."""
    not_built("down", "issue: up / down / status / logs")


def status() -> None:
    """Show a seat's state, nodes, ranks and endpoint (not built yet)."""
    not_built("status", "issue: up / down / status / logs")


def logs() -> None:
    """Show or follow a node's engine log (not built yet)."""
    not_built("logs", "issue: up / down / status / logs")


def demo() -> None:
    """Bring up the local-sim seat, send a few requests, print the answers, take it down (not built yet)."""
    not_built("demo", "issue: up / down / status / logs")


COMMANDS: dict[str, Callable[..., Any]] = {"up": up, "down": down, "status": status, "logs": logs, "demo": demo}
