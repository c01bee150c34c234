"""Extension point for the per-node watchdog sidecars (issue 5), called by `up` and `down`.

`up` calls :func:`start_sidecars` once the seat is READY (unless ``--no-watchdog``) and `down`
calls :func:`stop_sidecars` before engines are killed. Both import ``sgl_seat.watchdog.sidecar``
lazily and do nothing (a debug log) while that module does not exist. The module is expected to
provide ``start_sidecars(ctx: SidecarContext) -> None`` and ``stop_sidecars(ctx: SidecarContext) ->
None``; the driver is connected to Ray in the seat's namespace when they are called, and
``ctx.nodes`` gives each node agent's name so a sidecar can be placed on the same bundle
(``placement_group_bundle_index = node_rank`` of the group named ``ctx.pg_name``).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

log = logging.getLogger(__name__)

SIDECAR_MODULE = "sgl_seat.watchdog.sidecar"


@dataclass(frozen=True, slots=True)
class SidecarNode:
    node_rank: int
    agent: str
    ip: str | None


@dataclass(frozen=True, slots=True)
class SidecarContext:
    """What a sidecar needs to find the seat: names, the filled plan (JSON) and the spec's source."""

    seat: str
    namespace: str
    pg_name: str
    plan_json: str
    nodes: tuple[SidecarNode, ...]
    spec_source: str | None
    timeout: float = 60.0


def _module() -> ModuleType | None:
    try:
        return importlib.import_module(SIDECAR_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name and SIDECAR_MODULE.startswith(exc.name):
            log.debug("%s is not there yet; no watchdog sidecars", SIDECAR_MODULE)
            return None
        raise


def start_sidecars(ctx: SidecarContext) -> bool:
    """Start one sidecar per node if the watchdog is installed; True if it was."""
    mod = _module()
    fn = getattr(mod, "start_sidecars", None) if mod else None
    if fn is None:
        return False
    fn(ctx)
    return True


def stop_sidecars(ctx: SidecarContext) -> bool:
    mod = _module()
    fn = getattr(mod, "stop_sidecars", None) if mod else None
    if fn is None:
        return False
    fn(ctx)
    return True
