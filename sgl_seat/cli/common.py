"""Helpers shared by the CLI commands: the one error printer and JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

from rich.console import Console

from sgl_seat.errors import NotBuiltYet

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(doc: Any) -> None:
    """JSON on stdout, nothing else (so ``--json`` output pipes into jq)."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def not_built(command: str, issue: str) -> NoReturn:
    raise NotBuiltYet(
        f"`sgl-seat {command}` is not built yet ({issue})",
        fix="see the open issues; `sgl-seat plan` works today",
    )
