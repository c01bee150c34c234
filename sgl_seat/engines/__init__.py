"""Engine backends behind one interface: ``sglang`` (real) and ``sim`` (stand-in)."""

from __future__ import annotations

from sgl_seat.engines.base import EngineBackend, parse_kv_tokens
from sgl_seat.engines.sglang import SGLangBackend
from sgl_seat.engines.sim import SimBackend
from sgl_seat.errors import UsageError

__all__ = ["EngineBackend", "SGLangBackend", "SimBackend", "backend_for", "parse_kv_tokens"]

_BACKENDS: dict[str, type[EngineBackend]] = {"sglang": SGLangBackend, "sim": SimBackend}


def backend_for(engine: str) -> EngineBackend:
    try:
        return _BACKENDS[engine]()
    except KeyError:
        raise UsageError(f"unknown engine {engine!r}", fix=f"use one of {sorted(_BACKENDS)}") from None
