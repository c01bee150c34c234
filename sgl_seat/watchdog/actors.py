"""The Ray face of the watchdog: the sidecar actor, its peers over Ray, and what `up`, `down` and `watch` call.

:class:`SidecarActor` wraps a :class:`~sgl_seat.watchdog.sidecar.Sidecar` as a detached, named Ray actor
(``sgl-seat-<seat>-watchdog<r>`` in the seat's namespace) on the node agent's bundle; every method takes and
returns JSON strings, so nothing sgl-seat defines is pickled between processes. :func:`start_sidecars` /
:func:`stop_sidecars` are what `up` and `down` call (through ``sgl_seat.launch.sidecars``) with a typed
:class:`~sgl_seat.watchdog.config.SidecarContext`; :func:`snapshots` is what `watch` reads. Every Ray call
has a timeout (``ray.get``'s own, or :func:`sgl_seat.deadline.bounded` for those without one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.errors import ClusterError
from sgl_seat.spec import WatchdogSpec, load_spec
from sgl_seat.watchdog.config import SidecarConfig, SidecarContext, metrics_port_for, rank0_metrics_url, sidecar_name
from sgl_seat.watchdog.peers import CoordinatorUnreachable
from sgl_seat.watchdog.sidecar import Sidecar

log = logging.getLogger("sgl_seat.watchdog")

#: Seconds a capture waits for every node's part (the coordinator's deadline).
CAPTURE_TIMEOUT_S = 20.0
#: Seconds the coordinator waits for each other sidecar to answer a ping before it captures without that node.
PING_TIMEOUT_S = 3.0


class SidecarActor:
    """Ray face of :class:`Sidecar`: JSON strings in and out."""

    def __init__(self, config_json: str) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics poll otherwise
        self.cfg = SidecarConfig.from_json(config_json)
        peers = RayPeers(self.cfg) if self.cfg.nnodes > 1 and self.cfg.namespace else None
        self.core = Sidecar(self.cfg, peers=peers)
        self.core.start()

    def ping(self) -> str:
        return json.dumps({"node": self.cfg.node, "pid": os.getpid(), "metrics_port": self.core.exporter.port,
                           "sampler": self.core.sampler.state, "processes": len(self.core.sampler.live())})

    def request_capture(self, trigger_json: str) -> str:
        return json.dumps(self.core.coordinate(json.loads(trigger_json)))

    def capture_part(self, capture_id: str, t: float) -> str:
        return json.dumps(self.core.part(capture_id, t))

    def snapshot(self) -> str:
        return json.dumps(self.core.snapshot())

    def stop(self) -> str:
        self.core.stop()
        return "{}"


class RayPeers:
    """Reaches the other sidecars by name in the seat's namespace, every call under a timeout."""

    def __init__(self, cfg: SidecarConfig) -> None:
        self.cfg = cfg
        self._handles: dict[int, Any] = {}

    def _actor(self, node: int) -> Any:
        """Node ``node``'s sidecar. The lookup asks the GCS, which a node cut off from the head cannot reach: it
        is bounded, and a handle once found is kept (calls on it go to the actor directly, not via the GCS)."""
        import ray

        if node not in self._handles:
            self._handles[node] = bounded(f"ray.get_actor(watchdog {node})", ray.get_actor,
                                          sidecar_name(self.cfg.seat, node), namespace=self.cfg.namespace,
                                          timeout=PING_TIMEOUT_S)
        return self._handles[node]

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        import ray

        try:
            coord = self._actor(0)
            ray.get(coord.ping.remote(), timeout=3.0)
        except Exception as exc:
            raise CoordinatorUnreachable(f"{type(exc).__name__}: {exc}") from None
        ans: dict[str, Any] = json.loads(ray.get(coord.request_capture.remote(json.dumps(trigger)),
                                                 timeout=CAPTURE_TIMEOUT_S + 15))
        return ans

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        import ray

        futures: dict[int, Any] = {}
        pings: dict[int, Any] = {}
        missing: list[dict[str, Any]] = []
        for n in range(self.cfg.nnodes):
            if n == self.cfg.node:
                continue
            try:
                actor = self._actor(n)
                futures[n] = actor.capture_part.remote(capture_id, t)
                pings[n] = actor.ping.remote()  # the actor is threaded: a ping is answered beside the capture
            except Exception as exc:
                missing.append({"node": n, "step": "capture", "status": "error", "detail": f"no sidecar: {exc}"})
        # A node that does not answer a ping in PING_TIMEOUT_S (link down, raylet or host dead) is not waited
        # for: the capture finishes without it, and the verdict names it (core.nodeloss).
        ping_deadline = time.monotonic() + PING_TIMEOUT_S
        for n, ref in pings.items():
            try:
                ray.get(ref, timeout=max(0.1, ping_deadline - time.monotonic()))
            except Exception as exc:
                del futures[n]
                missing.append({"node": n, "step": "reach", "status": "unreachable",
                                "detail": f"no answer to a ping within {PING_TIMEOUT_S:g} s"
                                          f" ({type(exc).__name__})"})
        parts = [local()]
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        for n, fut in futures.items():
            try:
                parts.append(json.loads(ray.get(fut, timeout=max(0.5, deadline - time.monotonic()))))
            except Exception as exc:
                missing.append({"node": n, "step": "capture", "status": "error",
                                "detail": f"{type(exc).__name__}: {exc}"[:300]})
        return parts, missing


def _rget(ref: Any, timeout: float) -> Any:
    import ray

    return ray.get(ref, timeout=timeout)


def configs_of(ctx: SidecarContext) -> list[SidecarConfig]:
    """One config per node from the `up` context (filled plan JSON, the spec for thresholds)."""
    import ray

    plan = json.loads(ctx.plan_json)
    spec = load_spec(ctx.spec_source) if ctx.spec_source else None
    wd = spec.watchdog if spec is not None else WatchdogSpec()
    quota = spec.bundles.quota_mb if spec is not None else 2048
    rank_nodes = {int(r["tp_rank"]): int(n["node_rank"]) for n in plan["nodes"] for r in n["ranks"]}
    http_port = int(plan["http_port"])
    metrics_url = rank0_metrics_url(plan, next((n.ip for n in ctx.nodes if n.node_rank == 0), None))
    out = []
    for nd in ctx.nodes:
        r = nd.node_rank
        node_env = plan["nodes"][r].get("env") or {}
        root_pid = log_path = request_log_dir = None
        try:
            agent = ray.get_actor(nd.agent, namespace=ctx.namespace)
            st = json.loads(_rget(agent.engine_state.remote(), min(30.0, ctx.timeout)))
            root_pid = st.get("pid")
            log_path = st.get("log_path")
            if "--log-requests-target" in plan["nodes"][r]["command"]:  # node 0 while the watchdog is on
                request_log_dir = st.get("request_log_dir")
        except Exception as exc:
            log.warning("node %d: no engine state from agent %s (%s); finding engines by title", r, nd.agent, exc)
        out.append(SidecarConfig(
            seat=ctx.seat, node=r, nnodes=len(plan["nodes"]), thresholds=wd.model_dump(), bundle_dir=ctx.bundles_dir,
            quota_mb=quota, probe_dir=node_env.get("SGL_SEAT_PROBE_DIR"), log_path=log_path, metrics_url=metrics_url,
            metrics_port=metrics_port_for(http_port, r), rank_nodes=rank_nodes, root_pid=root_pid,
            engine_port=http_port, plan=plan, namespace=ctx.namespace, request_log_dir=request_log_dir,
            raw_prompts=bool(spec is not None and spec.bundles.raw_prompts)))
    return out


def start_sidecars(ctx: SidecarContext) -> None:
    """`up`: one detached sidecar actor per node on the node agent's bundle. Never fails `up`: a sidecar that
    cannot start is logged and the seat serves without it."""
    import ray
    from ray.util import get_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:
        pg = get_placement_group(ctx.pg_name)
        configs = configs_of(ctx)
    except Exception as exc:
        log.error("watchdog sidecars not started: %s", exc)
        return
    remote_cls: Any = ray.remote(SidecarActor)
    handles = []
    for cfg in configs:
        name = sidecar_name(ctx.seat, cfg.node)
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(name, namespace=ctx.namespace))  # a leftover of an earlier seat
        try:
            h = remote_cls.options(
                name=name, namespace=ctx.namespace, lifetime="detached", num_cpus=0, max_concurrency=8,
                max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=cfg.node),
            ).remote(cfg.to_json())
            handles.append((cfg.node, h))
        except Exception as exc:
            log.error("node %d: watchdog sidecar not started: %s", cfg.node, exc)
    for node, h in handles:
        try:
            info = json.loads(_rget(h.ping.remote(), ctx.timeout))
            log.info("node %d: watchdog sidecar up (%s)", node, info)
        except Exception as exc:
            log.error("node %d: watchdog sidecar did not answer: %s", node, exc)


def stop_sidecars(ctx: SidecarContext) -> None:
    """`down` (before engines are killed): stop each sidecar, then kill its actor."""
    import ray

    for nd in ctx.nodes:
        name = sidecar_name(ctx.seat, nd.node_rank)
        try:
            h = ray.get_actor(name, namespace=ctx.namespace)
        except ValueError:
            continue
        with contextlib.suppress(Exception):
            ray.get(h.stop.remote(), timeout=15)
        with contextlib.suppress(Exception):
            ray.kill(h)


def snapshots(seat: str, namespace: str, nnodes: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every reachable sidecar's snapshot (for `watch`); a missing one is a dict with an error."""
    import ray

    out: list[dict[str, Any]] = []
    futs: list[tuple[int, Any]] = []
    for n in range(nnodes):
        try:
            # get_actor asks the GCS with no deadline of its own: a wedged cluster must not hang `watch`.
            actor = bounded("ray.get_actor (watchdog sidecar)", ray.get_actor, sidecar_name(seat, n),
                            namespace=namespace, timeout=timeout)
            futs.append((n, actor.snapshot.remote()))
        except ValueError:
            out.append({"node": n, "error": "no watchdog sidecar (seat started with --no-watchdog, or down)"})
        except ClusterError as exc:
            out.append({"node": n, "error": str(exc)[:200]})
    for n, f in futs:
        try:
            out.append(json.loads(_rget(f, timeout)))
        except Exception as exc:
            out.append({"node": n, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return sorted(out, key=lambda d: int(d.get("node", 0)))
