"""Installing the probe: each target wrapped in its owner now, or the moment its module finishes importing.

``install`` (or ``install_from_env``, which reads ``SGLSEAT_PROBE``) replaces each target (a function, a method,
a static or class method) by :func:`.writer.make_wrapper`'s wrapper in the module that holds it. A target whose
module is not imported yet waits in ``_PENDING``; an import hook (:class:`_ProbeFinder`, first on
``sys.meta_path``) wraps it when that module has executed, before anyone else can fetch the function from it.
Installing is idempotent per target, and never raises into the engine (a target that cannot be wrapped is
warned about once and left as it is). A ``link`` target (:data:`.targets.LINK_MODE`) is not probed at all: its
constructor gets :func:`.graph.make_runner_link`, which only gives the backend its runner.

In a rehearsal seat (``SGLSEAT_PROBE_REHEARSAL=1``, see :mod:`.fault`) each target is first put behind the
rehearsal gate, inside the probe's wrapper (``probe_wrapper(gate(fn))``), so that a stall the gate makes is a call
in flight in the ring. Without that variable no gate is added: the production hot path is the probe's alone.

Why a module of its own: finding and replacing targets (import hooks, owners, descriptors) is the probe's
start-up, done once per target; the writer's hot path knows nothing of it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from . import fault, oldnames
from .beat import make_beat_wrapper
from .graph import make_graph_wrapper, make_runner_link
from .guard import warn_once
from .targets import TargetSpec, parse_target
from .writer import make_wrapper

ENV_TARGETS = "SGLSEAT_PROBE"

_INSTALLED: dict[str, str] = {}  # target spec -> "installed" | "pending" | "failed: ..."
_PENDING: dict[str, list[TargetSpec]] = {}
_FINDER: _ProbeFinder | None = None


def _resolve_owner(module: ModuleType, qualname: str) -> tuple[Any, str]:
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _probed(fn: Any, spec: TargetSpec) -> Any:
    """The probe's wrapper of ``fn``, with the rehearsal gate inside it only in a rehearsal (env, read per target); a
    graph-replay target (mode ``graph``) gets the replay wrapper and its CUDA events (:mod:`.graph`); a ``link``
    target (a graph backend's constructor) only the runner link, never the gate: nothing of it is timed or stalled;
    a ``beat`` target (:mod:`.beat`) only its heartbeat, never the gate either."""
    if spec.runner_link:
        return make_runner_link(fn, spec)
    if spec.beat:
        return make_beat_wrapper(fn, spec)
    inner = fault.gate(fn, spec) if fault.enabled() else fn
    return make_graph_wrapper(inner, spec) if spec.graph_replay else make_wrapper(inner, spec)


def _wrap_in(module: ModuleType, spec: TargetSpec) -> str:
    """Replace the target attribute in its owner; returns the install state string."""
    try:
        owner, attr = _resolve_owner(module, spec.qualname)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if raw is None:
            raw = getattr(owner, attr)
        if isinstance(raw, staticmethod):
            fn = raw.__func__
            if getattr(fn, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, staticmethod(_probed(fn, spec)))
        elif isinstance(raw, classmethod):
            fn = raw.__func__
            if getattr(fn, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, classmethod(_probed(fn, spec)))
        else:
            if not callable(raw):
                return f"failed: {spec.name} is not callable"
            if getattr(raw, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, _probed(raw, spec))
        return "installed"
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"


class _ProbeFinder(importlib.abc.MetaPathFinder):
    """Wraps targets of a module the moment it finishes executing (modules not imported yet)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_and_wrap(module: ModuleType) -> None:
            exec_module(module)
            for t in _PENDING.pop(fullname, []):
                state = _wrap_in(module, t)
                _INSTALLED[t.raw] = state
                if state.startswith("failed"):
                    warn_once(t.raw, f"cannot wrap {t.raw}: {state}")

        try:
            loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        except Exception as exc:
            warn_once(fullname, f"cannot hook the import of {fullname}: {exc}")
        return spec


def install(targets: Sequence[str | TargetSpec]) -> dict[str, str]:
    """Wrap each target now (module already imported) or when its module is imported. Idempotent."""
    global _FINDER
    for item in targets:
        try:
            spec = item if isinstance(item, TargetSpec) else parse_target(item)
        except ValueError as exc:
            _INSTALLED[str(item)] = f"failed: {exc}"
            warn_once(str(item), str(exc))
            continue
        if _INSTALLED.get(spec.raw) == "installed":
            continue
        module = sys.modules.get(spec.module)
        if module is not None:
            state = _wrap_in(module, spec)
            _INSTALLED[spec.raw] = state
            if state.startswith("failed"):
                warn_once(spec.raw, f"cannot wrap {spec.raw}: {state}")
            continue
        waiting = _PENDING.setdefault(spec.module, [])
        if all(w.raw != spec.raw for w in waiting):
            waiting.append(spec)
        _INSTALLED[spec.raw] = "pending"
        if _FINDER is None:
            _FINDER = _ProbeFinder()
            sys.meta_path.insert(0, _FINDER)
    return dict(_INSTALLED)


def install_from_env() -> dict[str, str]:
    """Install the targets named in ``SGLSEAT_PROBE`` (no-op when unset). Never raises.

    A seat planned by the previous release names its variables the old way: they are adopted first
    (:func:`.oldnames.adopt`), so every lazy read of this process finds the new names."""
    with contextlib.suppress(Exception):
        oldnames.adopt()
    value = os.environ.get(ENV_TARGETS, "")
    if not value.strip():
        return {}
    if os.environ.get(fault.ENV_FAULTS, "").strip() and not fault.enabled():
        warn_once("rehearsal-off", f"{fault.ENV_FAULTS} is set but {fault.ENV_REHEARSAL} is not 1: no fault armed")
    try:
        return install([p for p in value.split(",") if p.strip()])
    except Exception as exc:
        warn_once("install", f"probe not installed: {exc}")
        return dict(_INSTALLED)


def installed() -> dict[str, str]:
    """Target spec -> install state, for tests and diagnostics."""
    return dict(_INSTALLED)

