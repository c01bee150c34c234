"""The engine registry: engine name -> backend class (:func:`register`), the built-in ones loaded on first use."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import TypeVar

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines.base import EngineBackend
from sgl_seat.errors import UsageError

#: The built-in backends: engine name -> the module that registers it (imported on first use, as SGLang's
#: attention backends are: a seat of one engine never imports another's module).
_BUILTIN: dict[str, str] = {"sglang": "sgl_seat.engines.sglang", "sim": "sgl_seat.engines.sim",
                             "vllm": "sgl_seat.engines.vllm"}
_BACKENDS: dict[str, type[EngineBackend]] = {}

B = TypeVar("B", bound=type[EngineBackend])


def register(cls: B) -> B:
    """Class decorator: make ``cls`` the backend of engine ``cls.name`` (a seat's ``engine:``)."""
    have = _BACKENDS.get(cls.name)
    if have is not None and have is not cls:
        raise ValueError(f"engine {cls.name!r} is already registered by {have.__module__}.{have.__qualname__}")
    _BACKENDS[cls.name] = cls
    return cls


def _load(engine: str) -> type[EngineBackend] | None:
    if engine not in _BACKENDS and engine in _BUILTIN:
        importlib.import_module(_BUILTIN[engine])
    return _BACKENDS.get(engine)


def engine_names() -> list[str]:
    """Every engine a seat may name: the built-in ones and those registered since."""
    return sorted({*_BUILTIN, *_BACKENDS})


def _class_of(engine: str) -> type[EngineBackend]:
    cls = _load(engine)
    if cls is None:
        raise UsageError(f"unknown engine {engine!r}", fix=f"use one of {engine_names()}")
    return cls


def backend_for(engine: str) -> EngineBackend:
    return _class_of(engine)()


def words_for(engine: str) -> EngineWords:
    """The engine's names for its processes and metrics (what a bundle of that engine is read by)."""
    return _class_of(engine).words


def is_engine_main(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is the main process of a node of any engine (the watchdog finds a node's tree from it)."""
    return any(backend_for(name).is_main_cmdline(argv) for name in engine_names())


def words_of_metrics(names: Iterable[str]) -> EngineWords | None:
    """The words of the engine whose ``/metrics`` page has these sample names (a server someone else runs: the gate's
    ``--url``), by metric prefix; None when no engine's. Engines that share a prefix (the sim is SGLang's double)
    share their metric names, so either answers."""
    have = list(names)
    for name in engine_names():
        w = words_for(name)
        if w.metric_prefix and any(n.startswith(w.metric_prefix) for n in have):
            return w
    return None


def synthetic_markers() -> tuple[str, ...]:
    """Every engine's metric that says its figures are synthetic."""
    return tuple(w for w in (words_for(n).synthetic_marker for n in engine_names()) if w)


def is_engine_title(title: str) -> bool:
    """Whether ``title`` is one an engine gives its helper processes (any known engine's)."""
    return any(words_for(n).is_engine_title(title) for n in engine_names())
