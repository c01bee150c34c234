"""The watchdog sidecar: sampler (py-spy), probe (in-engine row-fetch timer), detectors, capture."""

from __future__ import annotations

import os


def boot_dir() -> str:
    """The directory holding the probe's ``sitecustomize.py`` (first on an engine's PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
