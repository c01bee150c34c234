"""The live watchdog: one sidecar per node that samples, probes, detects and captures a hang bundle.

``sidecar`` (the per-node core) over ``procfind``, ``pyspy`` and ``sampler`` (engine processes and their
stacks), ``sources`` (probe rings, ``/metrics``, the engine log), ``rankview`` (what `watch` shows per
rank), ``exporter`` (its own Prometheus metrics) and ``capture`` (one coordinated bundle); ``config``,
``peers`` and ``actors`` (the Ray face `up`, `down` and `watch` call). ``boot/`` runs inside the engine's
processes and loads the probe there (``sgl_seat.probe``, at the bottom of the house: standard library only).
The detectors themselves are ``sgl_seat.core`` (shared with offline replay).
"""

from __future__ import annotations

import os


def boot_dir() -> str:
    """The directory holding the probe's ``sitecustomize.py`` (first on an engine's PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
