"""Loads the sgl-seat probe into an engine that has no hook of ours (real SGLang).

The plan puts this directory first on ``PYTHONPATH`` when the watchdog is on, so every Python
process of the engine (main, schedulers, detokenizer; spawned children inherit the environment)
runs this at start-up. It installs the probe only when ``SGLSEAT_PROBE`` is set, never raises, and
then runs the ``sitecustomize`` this one shadows, if any (distributions ship one).
"""

from __future__ import annotations

import contextlib
import os
import sys


def _load_probe() -> None:
    # SGL_SEAT_PROBE: the old name, in a seat planned by the previous release (issue 49)  # old-env-name
    if not (os.environ.get("SGLSEAT_PROBE") or os.environ.get("SGL_SEAT_PROBE")):  # old-env-name
        return
    try:
        from sgl_seat import probe
    except Exception:
        # The engine's interpreter may not have sgl-seat installed: load the probe package (stdlib only, its modules
        # import each other relatively) by path, as the package "sgl_seat_probe".
        import importlib.util

        # sgl_seat/watchdog/boot/sitecustomize.py -> sgl_seat/probe
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "probe")
        spec = importlib.util.spec_from_file_location("sgl_seat_probe", os.path.join(path, "__init__.py"),
                                                      submodule_search_locations=[path])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}") from None
        probe = importlib.util.module_from_spec(spec)
        sys.modules["sgl_seat_probe"] = probe
        spec.loader.exec_module(probe)
    probe.install_from_env()


def _chain() -> None:
    """Run the next ``sitecustomize`` on sys.path (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)


try:
    _load_probe()
except Exception as exc:  # never break the engine's start-up
    with contextlib.suppress(Exception):
        sys.stderr.write(f"sgl-seat probe not loaded: {exc}\n")
try:
    _chain()
except Exception as exc:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"sgl-seat: the shadowed sitecustomize failed: {exc}\n")
