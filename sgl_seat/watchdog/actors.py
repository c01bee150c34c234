"""The Ray face of the watchdog: the sidecar actor, its peers over Ray, and what `up`, `down` and `watch` call.

:class:`SidecarActor` wraps a :class:`~sgl_seat.watchdog.sidecar.Sidecar` as a detached, named Ray actor
(``sgl-seat-<seat>-watchdog<r>`` in the seat's namespace) on the node agent's bundle; every method takes and
returns JSON strings, so nothing sgl-seat defines is pickled between processes. :func:`create_sidecar_actors` /
:func:`remove_sidecar_actors` are what `up` and `down` call (through ``sgl_seat.launch.sidecars``) with a typed
:class:`~sgl_seat.watchdog.config.SidecarContext`; :func:`snapshots` is what `watch` reads. Every Ray call
has a timeout (``ray.get``'s own, or :func:`sgl_seat.deadline.bounded` for those without one).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import Any

from sgl_seat import envcompat
from sgl_seat.deadline import bounded
from sgl_seat.errors import ClusterError
from sgl_seat.niceness import restore_raylet_niceness
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.capture import wire
from sgl_seat.watchdog.config import (
    SidecarConfig,
    SidecarContext,
    exporter_address,
    metrics_port_for,
    rank0_metrics_url,
    sidecar_name,
)
from sgl_seat.watchdog.keeper import Watched, keeper_dir, start_keeper, stop_keeper
from sgl_seat.watchdog.peers import CoordinatorUnreachable
from sgl_seat.watchdog.selfcheck import seat_interfaces
from sgl_seat.watchdog.sidecar import Sidecar
from sgl_seat.watchdog.spool import SampleSpool

log = logging.getLogger("sgl_seat.watchdog")

#: Seconds a capture waits for every node's part (the coordinator's deadline).
CAPTURE_TIMEOUT_S = 20.0
#: Seconds the coordinator waits for each other sidecar to answer a ping before it captures without that node.
PING_TIMEOUT_S = 3.0
#: How long the coordinator waits for the other nodes' late parts (native stacks: a budget of
#: capture.NATIVE_BUDGET_S each, nvidia-smi about a second) before it adds what it has to the written bundle.
NATIVE_WAIT_S = 8.0
#: Seconds between two heartbeats (a ping) from each sidecar to every other one, sent from the sidecar's tick.
HEARTBEAT_S = 0.5
#: A sidecar that answered heartbeats and then answers none for this long is silent: its node is lost (link
#: down, raylet or host dead), a capture is triggered at once and does not wait for that node. Six heartbeats:
#: a ping between two sidecars' threads takes milliseconds, even on a loaded host.
SILENT_S = 3.0
#: Seconds between two lookups of a sidecar not found yet (each asks the GCS).
LOOKUP_EVERY_S = 2.0
#: A peer's sidecar unanswered this long: its node agent (another actor on that node) is pinged too. Should the
#: agent answer while the sidecar stays silent, the node is reachable and only its watchdog is gone (a sidecar
#: killed, or Ray restarting it): no node-unreachable bundle for that.
AGENT_AFTER_S = 1.0
#: How many times Ray restarts a sidecar that died on a live node (its __init__ starts it all again).
SIDECAR_RESTARTS = 3


class SidecarActor:
    """Ray face of :class:`Sidecar`: JSON strings in and out."""

    def __init__(self, config_json: str) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics poll otherwise
        self.cfg = SidecarConfig.from_json(config_json)
        #: Ray restarted this actor (it died on a live node: killed, or crashed); `watch` says so.
        self.restarted = False
        import ray

        if ray.is_initialized():  # as an actor (a unit test builds one in-process, without Ray)
            ctx = ray.get_runtime_context()
            here = ctx.get_node_id()
            if self.cfg.node_id and here != self.cfg.node_id:  # restarted where its bundle moved: nothing to watch
                raise RuntimeError(f"node {self.cfg.node}'s watchdog sidecar restarted on Ray node {here[:8]}, not "
                                   f"on its node {self.cfg.node_id[:8]}: it stays down (nothing of its node is here)")
            self.restarted = bool(ctx.was_current_actor_reconstructed)
        # A sidecar that must notice a hang is the last process to starve: not at Ray's worker niceness.
        self.niceness, self.niceness_note = restore_raylet_niceness(0)
        if self.niceness_note:
            logging.getLogger(__name__).warning("%s", self.niceness_note)
        peers = RayPeers(self.cfg) if self.cfg.nnodes > 1 and self.cfg.namespace else None
        raylet = os.getppid()  # Ray's worker processes are the raylet's children: a new parent means it died
        self._host_gone: Callable[[], bool] = lambda: os.getppid() != raylet
        # Outside Ray, for the raylet's death: this actor dies with it, the keeper takes its place then, with the
        # samples this sidecar spooled to the keeper's directory as its history.
        self._keeper_dir = keeper_dir(self.cfg.seat, self.cfg.node, os.getpid())
        spool: SampleSpool | None = None
        if self.cfg.nnodes > 1:
            with contextlib.suppress(OSError):  # no spool: the keeper's history begins at its takeover
                self._keeper_dir.mkdir(parents=True, exist_ok=True)
                spool = SampleSpool(self._keeper_dir)
        self.core = Sidecar(self.cfg, peers=peers, host_gone=self._host_gone, spool=spool)
        self._remediations_counted = 0
        self.core.start()
        self._keeper: Watched | None = None
        if self.cfg.nnodes > 1:
            try:
                self._keeper = start_keeper(self.cfg, self._keeper_dir, raylet=Watched.of(raylet),
                                            sidecar=Watched.of(os.getpid()))
            except Exception as exc:  # the watchdog without it still works while the raylet lives
                logging.getLogger(__name__).warning("node %d: no keeper (%s)", self.cfg.node, exc)

    def _alive_host(self) -> None:
        """Calls from other nodes reach this actor directly, not through its raylet: with the raylet gone it would
        still answer for a while, and the node would look reachable while its engines die. It says it is not."""
        if self._host_gone():
            raise RuntimeError(f"node {self.cfg.node}'s raylet is gone (this sidecar outlives it briefly)")

    def ping(self) -> str:
        """Liveness, and what a peer keeps as this node's "last seen" should it go silent (its address and Ray
        node id, its last stack sample, its last probe record)."""
        import ray

        self._alive_host()
        core = self.core
        node_ip: Callable[[], str] = ray.util.get_node_ip_address
        samples = core.sampler.samples(since=time.time() - 30.0)
        probes = core.probes.records() if core.probes is not None else []
        last = max(probes, key=lambda r: r.end if r.end is not None else r.start, default=None)
        return json.dumps({
            "node": self.cfg.node, "pid": os.getpid(), "metrics_port": core.exporter.port,
            "sampler": core.sampler.state, "processes": len(core.sampler.live()), "t": time.time(),
            "ip": node_ip(), "node_id": ray.get_runtime_context().get_node_id(),
            "last_sample_t": max((x.t for x in samples), default=None),
            "last_probe": None if last is None else
            {"rank": last.rank, "seq": last.seq, "target": last.target, "start": last.start, "end": last.end},
        })

    def request_capture(self, trigger_json: str) -> str:
        return json.dumps(self.core.coordinate(json.loads(trigger_json)))

    def capture_part(self, capture_id: str, t: float) -> str:
        self._alive_host()
        return json.dumps(wire(self.core.part(capture_id, t)))

    def capture_native(self, capture_id: str) -> str:
        self._alive_host()
        return json.dumps(self.core.native_part(capture_id))

    def remediations(self, history_json: str) -> str:
        """Count the seat's remediations this sidecar has not counted yet (the supervisor hands it the whole
        history after each one: a sidecar started since the last one counts them all, from 0)."""
        done = [r for r in json.loads(history_json) if r.get("outcome") != "pending"]
        for r in done[self._remediations_counted:]:
            self.core.exporter.remediation_done(r["action"], r["outcome"])
        self._remediations_counted = max(self._remediations_counted, len(done))
        return json.dumps({"counted": self._remediations_counted})

    def snapshot(self) -> str:
        return json.dumps({**self.core.snapshot(), "restarted": self.restarted})

    def stop(self) -> str:
        stop_keeper(self._keeper, self._keeper_dir)
        self.core.stop()
        return "{}"


class RayPeers:
    """Reaches the other sidecars by name in the seat's namespace, every call under a timeout; keeps a heartbeat
    to each (:meth:`silent`) so that a lost node is known before, not during, a capture."""

    def __init__(self, cfg: SidecarConfig) -> None:
        self.cfg = cfg
        self._handles: dict[int, Any] = {}
        self._looked_up: dict[int, float] = {}
        self._beat: dict[int, Any] = {}  # node -> its ping in flight
        self._sent: dict[int, float] = {}
        self._answer: dict[int, tuple[float, dict[str, Any]]] = {}  # node -> (answered at, last answer)
        self._error: dict[int, str] = {}
        self._silent: dict[int, str] = {}
        # Each peer's node agent: looked up while its sidecar answers (a lookup asks the GCS: never when it is
        # needed, with the link possibly down), pinged only while its sidecar is overdue.
        self._agents: dict[int, Any] = {}
        self._agent_looked_up: dict[int, float] = {}
        self._agent_beat: dict[int, tuple[float, Any]] = {}
        self._agent_answer: dict[int, float] = {}
        self._agent_sent: dict[int, float] = {}
        self._gaps: dict[int, str] = {}

    def silent(self, now: float) -> dict[int, str]:
        """Collect heartbeat answers and send the next ones (never blocks); the nodes whose sidecar answered
        before and then none for SILENT_S, each with what was last seen from it. A sidecar never seen (not
        started yet) is not silent: `up` reports that one."""
        import ray

        silent: dict[int, str] = {}
        gaps: dict[int, str] = {}
        for n in range(self.cfg.nnodes):
            if n == self.cfg.node:
                continue
            beat = self._beat.get(n)
            if beat is not None:
                ready, _ = ray.wait([beat], timeout=0)
                if ready:
                    del self._beat[n]
                    try:
                        self._answer[n] = (now, json.loads(ray.get(beat, timeout=1.0)))
                        self._error.pop(n, None)
                    except Exception as exc:
                        self._error[n] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                elif now - self._sent[n] >= SILENT_S:  # unanswered this long: a fresh ping, should the link return
                    del self._beat[n]
            if n not in self._beat and now - self._sent.get(n, float("-inf")) >= HEARTBEAT_S:
                self._sent[n] = now
                try:
                    self._beat[n] = self._lookup(n, now).ping.remote()
                except Exception as exc:
                    self._error[n] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            if n not in self._answer:
                continue
            quiet = now - self._answer[n][0]
            if quiet < AGENT_AFTER_S:
                self._find_agent(n, now)
            elif quiet >= SILENT_S and self._agent_answers(n, now):
                gaps[n] = (f"its watchdog sidecar has not answered for {quiet:.1f} s"
                           + (f" ({self._error[n]})" if self._error.get(n) else "")
                           + "; its node agent answers: the node is reachable, only its watchdog is gone")
            elif quiet >= SILENT_S:
                silent[n] = self._last_seen(n, now)
            else:
                self._agent_answers(n, now)  # pinged already, for its answer by SILENT_S
        self._silent, self._gaps = silent, gaps
        return silent

    def watch_gaps(self) -> dict[int, str]:
        """The peers whose sidecar is silent while their node agent answers (from the last :meth:`silent`)."""
        return dict(self._gaps)

    def _find_agent(self, node: int, now: float) -> None:
        """Look node ``node``'s agent up while its sidecar answers (at most every LOOKUP_EVERY_S, bounded)."""
        import ray

        if node in self._agents or node >= len(self.cfg.agents) or not self.cfg.namespace:
            return
        if now - self._agent_looked_up.get(node, float("-inf")) < LOOKUP_EVERY_S:
            return
        self._agent_looked_up[node] = now
        with contextlib.suppress(Exception):  # not found yet: the next look; never found: a silent node is lost
            self._agents[node] = bounded(f"ray.get_actor(agent {node})", ray.get_actor, self.cfg.agents[node],
                                         namespace=self.cfg.namespace, timeout=PING_TIMEOUT_S)

    def _agent_answers(self, node: int, now: float) -> bool:
        """Ping node ``node``'s agent (never blocks); whether it answered after that node's sidecar last did, within
        SILENT_S: then the node is reachable."""
        import ray

        handle = self._agents.get(node)
        if handle is None:
            return False
        beat = self._agent_beat.get(node)
        if beat is not None:
            sent, ref = beat
            ready, _ = ray.wait([ref], timeout=0)
            if ready:
                del self._agent_beat[node]
                with contextlib.suppress(Exception):
                    ray.get(ref, timeout=1.0)
                    self._agent_answer[node] = now
            elif now - sent >= SILENT_S:
                del self._agent_beat[node]
        if node not in self._agent_beat and now - self._agent_sent.get(node, float("-inf")) >= HEARTBEAT_S:
            self._agent_sent[node] = now  # every HEARTBEAT_S at most, answered or not (a dead one fails at once)
            with contextlib.suppress(Exception):
                self._agent_beat[node] = (now, handle.__ray_ready__.remote())
        at = self._agent_answer.get(node)
        return at is not None and at > self._answer[node][0] and now - at < SILENT_S

    def _lookup(self, node: int, now: float) -> Any:
        """The sidecar's handle, asking the GCS at most every LOOKUP_EVERY_S (from the tick: never long)."""
        if node not in self._handles:
            if now - self._looked_up.get(node, float("-inf")) < LOOKUP_EVERY_S:
                raise LookupError("not found yet")
            self._looked_up[node] = now
        return self._actor(node)

    def _last_seen(self, node: int, now: float, *, ask_ray: bool = False) -> str:
        """What was last seen from a silent node: its last heartbeat answer, its last stack sample and probe
        record as that answer gave them, the last error, and (``ask_ray``: a GCS call of up to a second, made
        by the capture beside its own part, never by the tick) Ray's view of its node."""
        at, ans = self._answer[node]
        bits = [f"heartbeat answered {now - at:.1f} s ago ({_hms(at)})"]
        if ans.get("ip"):
            bits.append(f"address {ans['ip']}")
        if ans.get("last_sample_t"):
            bits.append(f"last stack sample {_hms(float(ans['last_sample_t']))}")
        pr = ans.get("last_probe")
        if isinstance(pr, dict):
            done = f"ended {_hms(float(pr['end']))}" if pr.get("end") else "in flight"
            bits.append(f"last probe record rank {pr.get('rank')} {pr.get('target')} #{pr.get('seq')} "
                        f"started {_hms(float(pr['start']))}, {done}")
        else:
            bits.append("no probe record")
        if self._error.get(node):
            bits.append(f"last ping error {self._error[node]}")
        if ask_ray:
            bits.append(f"Ray: {_ray_view(str(ans.get('node_id') or ''))}")
        return "; ".join(bits)

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

        if 0 in self._silent:  # known lost: capture from here at once, do not spend a ping's timeout on it
            raise CoordinatorUnreachable(f"no heartbeat answer for {SILENT_S:g} s")
        try:
            coord = self._actor(0)
            # A heartbeat answered within the last two beats is the ping: a hang's capture waits for no round trip.
            if time.time() - self._answer.get(0, (float("-inf"), {}))[0] > 2 * HEARTBEAT_S:
                ray.get(coord.ping.remote(), timeout=PING_TIMEOUT_S)
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
        # This node's part is taken while the others are pinged and asked (it takes about a second of stack dumps).
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        mine = pool.submit(local)
        pool.shutdown(wait=False)
        silent = dict(self._silent)
        for n in range(self.cfg.nnodes):
            if n == self.cfg.node:
                continue
            if n in silent:  # lost before the capture: not asked, named with what was last seen from it
                missing.append({"node": n, "step": "reach", "status": "unreachable",
                                "detail": f"no heartbeat answer for {SILENT_S:g} s",
                                "last_seen": self._last_seen(n, time.time(), ask_ray=True)})
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
            # A node already silent on heartbeats is lost SILENT_S after its last answer, the tick's own rule.
            quiet_for = time.time() - self._answer[n][0] if n in self._answer else 0.0
            until = min(ping_deadline, time.monotonic() + max(0.5, SILENT_S - quiet_for))
            try:
                ray.get(ref, timeout=max(0.1, until - time.monotonic()))
            except Exception as exc:
                del futures[n]
                seen = self._last_seen(n, time.time(), ask_ray=True) if n in self._answer else ""
                missing.append({"node": n, "step": "reach", "status": "unreachable",
                                "detail": f"no answer to a ping within {PING_TIMEOUT_S:g} s, or to heartbeats for "
                                          f"{SILENT_S:g} s ({type(exc).__name__})", "last_seen": seen})
        parts = [mine.result()]
        deadline = time.monotonic() + CAPTURE_TIMEOUT_S
        for n, fut in futures.items():
            try:
                parts.append(json.loads(ray.get(fut, timeout=max(0.5, deadline - time.monotonic()))))
            except Exception as exc:
                # Answered the ping, then lost mid-capture (a raylet killed while its part was being taken):
                # named like a node lost before it, with what was last seen from it.
                seen = self._last_seen(n, time.time(), ask_ray=True) if n in self._answer else ""
                missing.append({"node": n, "step": "capture", "status": "error",
                                "detail": f"{type(exc).__name__}: {exc}"[:300], "last_seen": seen})
        return parts, missing

    def collect_native(self, capture_id: str, nodes: list[int], local: Callable[[], dict[str, Any]]
                       ) -> list[dict[str, Any]]:
        import ray

        refs = {}
        for n in nodes:
            if n == self.cfg.node:
                continue
            with contextlib.suppress(Exception):
                refs[n] = self._actor(n).capture_native.remote(capture_id)
        out = [local()]
        deadline = time.monotonic() + NATIVE_WAIT_S
        for n, ref in refs.items():
            try:
                out.append(json.loads(ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))))
            except Exception as exc:  # the bundle keeps that node's Python stacks
                out.append({"node": n, "native": [], "gpu": None, "capture": [
                    {"node": n, "step": "native", "status": "error", "detail": f"{type(exc).__name__}: {exc}"[:300]}]})
        return out


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f"{t % 1:.1f}"[1:] + " UTC"


def _ray_view(node_id: str) -> str:
    """Ray's word on a node (from the GCS, bounded: a node cut off from the head cannot ask it)."""
    import ray

    if not node_id:
        return "node id unknown"
    try:
        nodes: list[dict[str, Any]] = bounded("ray.nodes()", ray.nodes, timeout=1.0)
    except Exception as exc:
        return f"not asked ({type(exc).__name__})"
    for nd in nodes:
        if nd.get("NodeID") == node_id:
            if nd.get("Alive"):
                return f"node {node_id[:8]} alive (Ray has not marked it dead yet)"
            why = nd.get("DeathReasonMessage") or nd.get("DeathReason") or ""
            return f"node {node_id[:8]} dead" + (f" ({str(why)[:120]})" if why else "")
    return f"node {node_id[:8]} not in Ray's node table"


class _DropMessage(logging.Filter):
    """Drops the log records whose message holds ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _rget(ref: Any, timeout: float) -> Any:
    import ray

    return ray.get(ref, timeout=timeout)


def configs_of(ctx: SidecarContext) -> list[SidecarConfig]:
    """One config per node from the `up` context (filled plan JSON, the recorded spec for thresholds)."""
    import ray

    plan = json.loads(ctx.plan_json)
    spec = ctx.spec
    wd = spec.watchdog if spec is not None else WatchdogSpec()
    quota = spec.bundles.quota_mb if spec is not None else 2048
    rank_nodes = {int(r["tp_rank"]): int(n["node_rank"]) for n in plan["nodes"] for r in n["ranks"]}
    http_port = int(plan["http_port"])
    metrics_url = rank0_metrics_url(plan, next((n.ip for n in ctx.nodes if n.node_rank == 0), None))
    head: str | None = None
    with contextlib.suppress(Exception):  # the driver's view of the head: what a sidecar checks it can reach
        head = str(ray.get_runtime_context().gcs_address) or None
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
            quota_mb=quota, probe_dir=envcompat.lookup(node_env, "SGLSEAT_PROBE_DIR"), log_path=log_path,
            metrics_url=metrics_url,
            metrics_port=metrics_port_for(http_port, r), rank_nodes=rank_nodes, root_pid=root_pid,
            engine_port=http_port, plan=plan, namespace=ctx.namespace, request_log_dir=request_log_dir,
            raw_prompts=bool(spec is not None and spec.bundles.raw_prompts),
            exporter_addr=exporter_address(wd.exporter_bind, nd.ip),
            interfaces=seat_interfaces(plan["nodes"][r], nd.ip), head_address=head,
            agents=[n.agent for n in sorted(ctx.nodes, key=lambda n: n.node_rank)], node_id=nd.node_id,
            engine=str(plan["engine"])))
    return out


def create_sidecar_actors(ctx: SidecarContext) -> None:
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
    # Ray warns that a restartable detached actor in a placement group is killed, never restarted, once the group
    # is removed: that is what `down` wants (it removes the group last); the restarts are for a sidecar that died
    # on a live node. The warning would only alarm an operator at every `up`.
    quiet = _DropMessage("restartable detached actor with a placement group")
    logging.getLogger("ray.actor").addFilter(quiet)
    for cfg in configs:
        name = sidecar_name(ctx.seat, cfg.node)
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(name, namespace=ctx.namespace))  # a leftover of an earlier seat
        try:
            h = remote_cls.options(
                name=name, namespace=ctx.namespace, lifetime="detached", num_cpus=0, max_concurrency=8,
                max_restarts=SIDECAR_RESTARTS, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=cfg.node),
            ).remote(cfg.to_json())
            handles.append((cfg.node, h))
        except Exception as exc:
            log.error("node %d: watchdog sidecar not started: %s", cfg.node, exc)
    logging.getLogger("ray.actor").removeFilter(quiet)
    for node, h in handles:
        try:
            info = json.loads(_rget(h.ping.remote(), ctx.timeout))
            log.info("node %d: watchdog sidecar up (%s)", node, info)
        except Exception as exc:
            log.error("node %d: watchdog sidecar did not answer: %s", node, exc)


def remove_sidecar_actors(ctx: SidecarContext, *, brief: Collection[int] = (), brief_s: float = 3.0,
                  wait_s: float = 15.0) -> None:
    """`down` (before engines are killed): stop each sidecar, then kill its actor.

    The sidecars of the nodes in ``brief`` (whose agent Ray no longer knows: a killed agent on a well node, or a
    node whose raylet is gone) get ``brief_s`` to answer, the others ``wait_s``: a sidecar that died with its raylet
    cannot answer, and waiting out the full stop for it would break `down`'s bound with a node unreachable."""
    import ray

    handles: list[tuple[int, Any]] = []
    for nd in ctx.nodes:
        name = sidecar_name(ctx.seat, nd.node_rank)
        try:
            handles.append((nd.node_rank, ray.get_actor(name, namespace=ctx.namespace)))
        except ValueError:
            continue
    # Every sidecar stops before any is killed: a sidecar that outlived a killed peer would take it for a lost node.
    stops = [(n, h.stop.remote()) for n, h in handles]
    t0 = time.monotonic()
    with contextlib.suppress(Exception):
        ray.wait([r for _, r in stops], num_returns=len(stops), timeout=min(brief_s, wait_s))
        rest = [r for n, r in stops if n not in brief]
        left = wait_s - (time.monotonic() - t0)
        if rest and left > 0:
            ray.wait(rest, num_returns=len(rest), timeout=left)
    for _, h in handles:
        with contextlib.suppress(Exception):
            ray.kill(h)


def count_remediations(seat: str, namespace: str, nnodes: int, history: list[dict[str, Any]],
                       timeout: float = 10.0) -> None:
    """Hand every node's sidecar the seat's remediation history to count (:meth:`SidecarActor.remediations`)."""
    import ray

    text = json.dumps(history)
    futs: list[Any] = []
    for n in range(nnodes):
        with contextlib.suppress(ValueError):  # no sidecar on that node: nothing to count there
            actor = bounded("ray.get_actor (watchdog sidecar)", ray.get_actor, sidecar_name(seat, n),
                            namespace=namespace, timeout=timeout)
            futs.append(actor.remediations.remote(text))
    for f in futs:
        _rget(f, timeout)


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
