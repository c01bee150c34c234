"""Helpers shared by the CLI commands: the one error printer and JSON output."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.text import Text

# markup=False: paths, log lines and error texts may contain "[...]"; styled output is built with
# rich Text (see ``styled``), never by formatting untrusted text into markup.
console = Console(highlight=False, soft_wrap=True, markup=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def styled(style: str, head: str, rest: str = "") -> Text:
    """``head`` in ``style`` followed by plain ``rest``: safe for any text."""
    return Text.assemble((head, style), rest)


def print_json(doc: Any) -> None:
    """JSON on stdout, nothing else (so ``--json`` output pipes into jq)."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    # Out at once: a Ray driver whose cluster is dying can be ended by Ray's own core worker without Python's exit
    # (CI: `down --json` with a node's raylet killed exited 1 with nothing on its piped stdout).
    sys.stdout.flush()

