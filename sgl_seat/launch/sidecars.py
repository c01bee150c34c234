"""Extension point for the per-node watchdog sidecars (issue 5), called by `up` and `down`.

`up` calls :func:`start_sidecars` once the seat is READY (unless ``--no-watchdog`` or the spec's
``watchdog.enabled: false``) and `down` calls :func:`stop_sidecars` before engines are killed. Both
import ``sgl_seat.watchdog.sidecar`` lazily. The module is expected to provide
``start_sidecars(ctx: SidecarContext) -> None``, ``stop_sidecars(ctx: SidecarContext) -> None``,
``sidecar_name(seat, node_rank) -> str`` (the detached actor's name in ``ctx.namespace``) and an actor
method ``ping()``; the driver is connected to Ray in the seat's namespace when they are called, and
``ctx.nodes`` gives each node agent's name so a sidecar can be placed on the same bundle
(``placement_group_bundle_index = node_rank`` of the group named ``ctx.pg_name``).

The module's ``start_sidecars`` logs a sidecar that did not start and returns normally (the seat serves
without it), so whether the watchdog runs is found out here: every node's sidecar must answer ``ping``.
Both calls run under a deadline (a wedged GCS or sidecar must not hang `up` or `down`).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from types import ModuleType

from sgl_seat.errors import SeatError
from sgl_seat.launch.cluster import bounded, get

log = logging.getLogger(__name__)

SIDECAR_MODULE = "sgl_seat.watchdog.sidecar"
#: The module's start pings each sidecar for up to ``ctx.timeout``; past twice that plus this, `up` goes on.
START_GRACE_S = 30.0


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


@dataclass(frozen=True, slots=True)
class SidecarsStarted:
    """What `up` reports: ``ok`` only when every node's sidecar answered."""

    ok: bool
    detail: str


def start_sidecars(ctx: SidecarContext) -> SidecarsStarted:
    """Start one sidecar per node, then check that each answers; the outcome says which did not."""
    mod = _module()
    fn = getattr(mod, "start_sidecars", None) if mod else None
    if mod is None or fn is None:
        return SidecarsStarted(False, f"not started: {SIDECAR_MODULE}.start_sidecars is not installed")
    try:
        bounded(f"{SIDECAR_MODULE}.start_sidecars", fn, ctx, timeout=2 * ctx.timeout + START_GRACE_S)
    except Exception as exc:  # the seat is READY: the watchdog failing must not take it down
        return SidecarsStarted(False, f"not started: {_text(exc)}")
    name = getattr(mod, "sidecar_name", None)
    if name is None:
        return SidecarsStarted(False, f"started, but not checked ({SIDECAR_MODULE}.sidecar_name is missing)")
    missing = []
    for nd in ctx.nodes:
        err = _ping(ctx, name(ctx.seat, nd.node_rank))
        if err is not None:
            missing.append(f"node {nd.node_rank}: {err}")
    if missing:
        return SidecarsStarted(False, "not running on every node (the seat is not watched there): "
                                      + "; ".join(missing))
    return SidecarsStarted(True, f"running on nodes {', '.join(str(n.node_rank) for n in ctx.nodes)}")


def _ping(ctx: SidecarContext, actor: str) -> str | None:
    import ray

    try:
        handle = bounded(f"ray.get_actor({actor!r})", ray.get_actor, actor, namespace=ctx.namespace)
        get(handle.ping.remote(), min(ctx.timeout, 15.0), f"sidecar {actor}")
    except ValueError:
        return f"no sidecar actor {actor}"
    except Exception as exc:
        return _text(exc)
    return None


def _text(exc: BaseException) -> str:
    msg = exc.message if isinstance(exc, SeatError) else f"{type(exc).__name__}: {exc}"
    return msg.splitlines()[0][:300] if msg else type(exc).__name__


def stop_sidecars(ctx: SidecarContext) -> bool:
    """Stop every sidecar (under a deadline); False when the watchdog is not installed."""
    mod = _module()
    fn = getattr(mod, "stop_sidecars", None) if mod else None
    if fn is None:
        return False
    bounded(f"{SIDECAR_MODULE}.stop_sidecars", fn, ctx, timeout=ctx.timeout)
    return True
