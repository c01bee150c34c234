"""`up` and `down`'s side of the per-node watchdog sidecars: start them, check that each answers, stop them.

`up` calls :func:`start_sidecars` once the seat is READY (unless ``--no-watchdog`` or the spec's
``watchdog.enabled: false``) and `down` calls :func:`stop_sidecars` before engines are killed. Both hand
the watchdog (:mod:`sgl_seat.watchdog.actors`) a typed :class:`~sgl_seat.watchdog.config.SidecarContext`
built from the seat's record (:func:`context_of`); the driver is connected to Ray in the seat's namespace
when they are called.

The watchdog's ``start_sidecars`` logs a sidecar that did not start and returns normally (the seat serves
without it), so whether the watchdog runs is found out here: every node's sidecar must answer ``ping``.
Both calls run under a deadline (a wedged GCS or sidecar must not hang `up` or `down`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from sgl_seat.deadline import bounded
from sgl_seat.errors import SeatError
from sgl_seat.launch.cluster import get
from sgl_seat.launch.seatrecord.record import SeatRecord, bundles_dir_of
from sgl_seat.watchdog import actors
from sgl_seat.watchdog.config import SidecarContext, SidecarNode, sidecar_name
from sgl_seat.watchdog.prometheus.scrape_config import ScrapeConfig, scrape_config

#: The alert rules shipped with sgl-seat, which the generated scrape config loads.
ALERT_RULES = Path(actors.__file__).resolve().parent / "prometheus" / "alerts.yml"

log = logging.getLogger(__name__)

#: The watchdog's start pings each sidecar for up to ``ctx.timeout``; past twice that plus this, `up` goes on.
START_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class SidecarsStarted:
    """What `up` reports: ``ok`` only when every node's sidecar answered."""

    ok: bool
    detail: str


def context_of(rec: SeatRecord, *, settings: bool = True) -> SidecarContext:
    """The watchdog's view of a recorded seat: names, the filled plan, the bundles' place and the spec as the record
    holds it (:meth:`SeatRecord.seat_spec`); ``settings`` False: no spec, for a context that only stops sidecars."""
    return SidecarContext(
        seat=rec.name, namespace=rec.namespace, pg_name=rec.pg_name, plan_json=json.dumps(rec.plan),
        nodes=tuple(SidecarNode(n.node_rank, n.agent, n.ip, n.node_id) for n in rec.nodes),
        bundles_dir=str(bundles_dir_of(rec)), spec=rec.seat_spec() if settings else None,
    )


def start_sidecars(ctx: SidecarContext) -> SidecarsStarted:
    """Start one sidecar per node, then check that each answers; the outcome says which did not."""
    what = f"{actors.__name__}.create_sidecar_actors"
    try:
        bounded(what, actors.create_sidecar_actors, ctx, timeout=2 * ctx.timeout + START_GRACE_S)
    except Exception as exc:  # the seat is READY: the watchdog failing must not take it down
        return SidecarsStarted(False, f"not started: {_text(exc)}")
    missing = []
    for nd in ctx.nodes:
        err = _ping(ctx, sidecar_name(ctx.seat, nd.node_rank))
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


def stop_sidecars(ctx: SidecarContext, *, brief: Collection[int] = (), brief_s: float = 3.0) -> None:
    """Stop every sidecar (under a deadline); those of the nodes in ``brief`` get ``brief_s`` to answer."""
    bounded(f"{actors.__name__}.remove_sidecar_actors", actors.remove_sidecar_actors, ctx, brief=brief, brief_s=brief_s,
            timeout=ctx.timeout)


def prometheus_config_of(rec: SeatRecord) -> ScrapeConfig:
    """`prometheus-config`: the scrape config of a recorded seat, every node's sidecar at the address and port `up`
    gave it (the spec's ``watchdog.exporter_bind``, read as the sidecars read it: from the seat record)."""
    from sgl_seat.spec import WatchdogSpec

    if rec.plan is None:
        raise SeatError(f"seat {rec.name!r} has no filled plan recorded (its `up` did not get that far)",
                        fix=f"run `sgl-seat status {rec.name}`, or bring the seat up again")
    spec = rec.seat_spec()
    bind = (spec.watchdog if spec is not None else WatchdogSpec()).exporter_bind
    return scrape_config(rec.name, int(rec.plan["http_port"]), [(n.node_rank, n.ip) for n in rec.nodes], bind,
                         endpoint=rec.endpoint, rule_files=[str(ALERT_RULES)])
