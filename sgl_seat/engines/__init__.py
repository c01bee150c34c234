"""Engine backends behind one interface: ``sglang`` (real) and ``sim`` (stand-in).

Everything engine-specific (the module to run, its environment, probe targets, fault validation,
preflight checks, bind hosts) is a method of :class:`EngineBackend`; the plan and launch get a backend
with :func:`backend_for` and never compare engine names themselves. The plan asks it once
(:meth:`EngineBackend.describe`) and builds from the :class:`EngineFacts` it answers.
"""

from __future__ import annotations

from sgl_seat.engines.base import EngineBackend, EngineFacts, parse_kv_tokens
from sgl_seat.engines.sglang import SGLangBackend
from sgl_seat.engines.sim import SimBackend
from sgl_seat.errors import UsageError

__all__ = ["ENGINE_MODULES", "EngineBackend", "EngineFacts", "SGLangBackend", "SimBackend", "backend_for",
           "parse_kv_tokens"]

_BACKENDS: dict[str, type[EngineBackend]] = {"sglang": SGLangBackend, "sim": SimBackend}
#: The module each engine runs as (``python -m <module>``), by engine name.
ENGINE_MODULES: dict[str, str] = {name: cls.module for name, cls in _BACKENDS.items()}


def backend_for(engine: str) -> EngineBackend:
    try:
        return _BACKENDS[engine]()
    except KeyError:
        raise UsageError(f"unknown engine {engine!r}", fix=f"use one of {sorted(_BACKENDS)}") from None
