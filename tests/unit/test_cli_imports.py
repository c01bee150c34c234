"""`sgl-seat --help` and `sgl-seat plan` import only what they use: no Ray, launch, watchdog, forensics or gate.

Why: every command pays the CLI's imports; `plan` is a dry run an operator repeats while tuning, and importing
Ray and the rest of the stack took most of its time (issue 10's mirror target is 0.5 s for the whole process).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("ray", "sgl_seat.launch.up", "sgl_seat.launch.cluster", "sgl_seat.watchdog", "sgl_seat.forensics",
         "sgl_seat.gate", "torch", "sglang")

PROBE = """
import json, sys
sys.argv = ["sgl-seat", *json.loads(sys.argv[1])]
from sgl_seat.cli.main import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules_after(args: list[str]) -> set[str]:
    env = {"SGLSEAT_SIZING": "mirror", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


@pytest.mark.parametrize("args", [["--help"], ["plan", "--seat", "large", "--draft", "on", "--json"]])
def test_cli_imports_only_what_the_command_uses(args: list[str]) -> None:
    mods = _modules_after(args)
    heavy = sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"sgl-seat {' '.join(args)} imported {heavy}"
    if args[0] == "plan":
        assert "sgl_seat.plan" in mods  # the probe ran the command, not just the parser


def test_a_lifecycle_command_still_imports_its_library() -> None:
    mods = _modules_after(["status", "no-such-seat"])  # fails cleanly, after importing launch's status
    assert "sgl_seat.launch.status" in mods
