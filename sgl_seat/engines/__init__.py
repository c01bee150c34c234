"""Engine backends behind one interface, by name: ``sglang`` (real), ``sim`` (stand-in), and any other registered.

Everything engine-specific (the module to run, its environment, its process and metric names, probe targets, fault
validation, preflight checks, bind hosts) is a method or attribute of :class:`EngineBackend`; the plan, launch, the
watchdog and the gate get a backend with :func:`backend_for` and never compare engine names themselves. The plan asks
it once (:meth:`EngineBackend.describe`) and builds from the :class:`EngineFacts` it answers.

A new engine is one module here whose backend class is decorated with :func:`register` (and listed in
:data:`_BUILTIN` so it is found without being imported first); nothing else names it.
"""

from __future__ import annotations

from sgl_seat.engines.base import EngineBackend, EngineFacts, parse_kv_tokens
from sgl_seat.engines.registry import (
    backend_for,
    engine_names,
    is_engine_main,
    is_engine_title,
    register,
    synthetic_markers,
    words_for,
    words_of_metrics,
)

__all__ = ["EngineBackend", "EngineFacts", "backend_for", "engine_names", "is_engine_main", "is_engine_title",
           "parse_kv_tokens", "register", "synthetic_markers", "words_for", "words_of_metrics"]
