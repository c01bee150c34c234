"""Where things are in the checkout, and how to run its CLI, for the rigs and the tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCAL_SIM = REPO / "launch" / "seats" / "local-sim.yaml"
MODEL_CONFIG = REPO / "launch" / "models" / "deepseek-v4-flash"


def cli_argv() -> list[str]:
    """`sgl-seat` beside this Python, or the module when the entry point is not installed."""
    exe = shutil.which("sgl-seat", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "sgl_seat.cli.main"]
