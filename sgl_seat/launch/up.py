"""`up` as a library call: the only code that applies a plan to Ray.

``up`` goes stage by stage (cluster, placement, agents, preflight, node 0's engine, dist-init
reachability, the other engines, READY, the watchdog's sidecars) and reports each stage's elapsed time
through a :class:`~sgl_seat.launch.stages.Reporter`. It either returns a READY seat or leaves nothing
behind: any error, and Ctrl-C, tear down what it created (the same teardown `down` runs,
:mod:`sgl_seat.launch.teardown`) before the error is re-raised. No call into Ray waits without a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from sgl_seat.core.remediation import Policy
from sgl_seat.deadline import bounded
from sgl_seat.engines import EngineBackend, backend_for
from sgl_seat.engines.preflight import Failure, preflight_error
from sgl_seat.errors import EngineError, PreflightError, SeatError, SeatStateError, UsageError
from sgl_seat.forensics.format.layout import seat_bundles_dir
from sgl_seat.launch import cluster, placement
from sgl_seat.launch.actors.agent import NodeAgent
from sgl_seat.launch.actors.supervisor import SupervisorConfig, start_supervisor, supervisor_name
from sgl_seat.launch.agentclient import (
    AgentClient,
    call_all,
    get_agent,
)
from sgl_seat.launch.bringup import bind_plan, local_port_failures, predicted_kv, start_engines
from sgl_seat.launch.host import localcluster
from sgl_seat.launch.seatchoice import choose_seat
from sgl_seat.launch.seatrecord.home import ensure_writable, host_id, seat_home
from sgl_seat.launch.seatrecord.names import agent_name, namespace_of, pg_name
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, claim_record, remove_record, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import context_of, start_sidecars
from sgl_seat.launch.stages import WARN, NullReporter, Reporter, Stages, StageTimes
from sgl_seat.launch.teardown import sigint_ignored, teardown
from sgl_seat.plan import LaunchPlan, build_plan
from sgl_seat.spec import SeatSpec, load_spec
from sgl_seat.watchdog.config import exporter_address

#: The most `up` waits for a local cluster (within --timeout): ~10 s on an idle 2-core machine, but the holder starts
#: it again when Ray's own 30 s node wait runs out (localcluster.START_ATTEMPTS), which a loaded machine needs.
LOCAL_CLUSTER_TIMEOUT_S = 240.0


@dataclass(kw_only=True, slots=True)
class UpOptions:
    """`up`'s knobs; ``None`` means the spec's value."""

    draft: bool | None = None
    slots: int | None = None
    mem_fraction: float | None = None
    timeout: float = 600.0
    faults: tuple[str, ...] = ()
    no_watchdog: bool = False
    #: ``--on-hang``: capture | restart | rollback-draft in place of the spec's ``watchdog.on_hang`` (None: the spec's).
    on_hang: str | None = None
    #: ``--port-base``: the seat's ports moved so that its HTTP port is this one (:meth:`SeatSpec.with_port_base`;
    #: None: the spec's ports).
    port_base: int | None = None


@dataclass(slots=True)
class _Session:
    """What one `up` has created so far: what its teardown may touch."""

    rec: SeatRecord
    connected: bool = False
    owns_ray_objects: bool = False
    cluster_pid: int | None = None
    cluster_ctime: float | None = None


def effective_policy(spec: SeatSpec, opts: UpOptions) -> Policy:
    """The on_hang policy the seat is brought up with: the spec's, ``opts.on_hang`` in place of its ``on_hang``.

    ``--on-hang restart`` (or rollback-draft) with ``--no-watchdog`` is refused: nothing would see the hang.
    """
    policy = Policy.of(spec.watchdog, opts.on_hang)
    if opts.on_hang is not None and policy.on_hang != "capture" and (opts.no_watchdog or not spec.watchdog.enabled):
        raise UsageError(f"--on-hang {policy.on_hang} acts on the watchdog's verdicts, and this `up` starts no "
                         "watchdog", fix="drop --no-watchdog (or set watchdog.enabled: true), or drop --on-hang")
    return policy


@dataclass(frozen=True, slots=True)
class UpRequest:
    """What `sgl-seat up` is asked for, checked before anything starts: the spec, the options, the policy."""

    spec: SeatSpec
    opts: UpOptions
    policy: Policy
    #: Which seat was taken when the operator named none (None when one was named).
    note: str | None


def prepare(seat: str | None, opts: UpOptions) -> UpRequest:
    """The seat ``seat`` names (else ./seat.yaml, else local-sim), its spec loaded and ``--on-hang`` checked:
    a bad spec or policy fails here, before a plan is sized or a cluster touched."""
    path, note = choose_seat(seat)
    spec = load_spec(path)
    return UpRequest(spec, opts, effective_policy(spec, opts), note)


def plan_of(spec: SeatSpec, opts: UpOptions) -> LaunchPlan:
    """The plan `up` applies for ``opts`` (``--dry-run`` prints it and starts nothing)."""
    return build_plan(spec.with_port_base(opts.port_base), draft=opts.draft, slots=opts.slots,
                      mem_fraction=opts.mem_fraction, faults=opts.faults)


def local_ports_error(spec: SeatSpec, opts: UpOptions) -> PreflightError | None:
    """The check `up` runs first on a seat whose nodes all run on this host (its "ports" stage: every port of every
    node free, :func:`~sgl_seat.launch.bringup.local_port_failures`), for a caller that starts that local cluster
    itself (the gate: one cluster for all its arms) and so must check before it does."""
    spec = spec.with_port_base(opts.port_base)
    return local_port_failures(plan_of(spec, opts), backend_for(spec.engine),
                               exporter=not (opts.no_watchdog or not spec.watchdog.enabled))


def up(spec: SeatSpec, opts: UpOptions, reporter: Reporter | None = None) -> tuple[SeatRecord, StageTimes]:
    """Bring the seat up and return its READY record and stage times; on any failure leave nothing behind."""
    # First, before a plan is sized, a cluster started or contacted: a home that takes no write would fail `up`
    # half-way (no seat record for `down`, no logs, no bundles) with an OS error instead of what to do.
    ensure_writable()
    spec = spec.with_port_base(opts.port_base)
    backend = backend_for(spec.engine)
    policy = effective_policy(spec, opts)
    plan = plan_of(spec, opts)
    stages = Stages(reporter or NullReporter())
    deadline = time.monotonic() + opts.timeout
    interrupted = threading.Event()  # set by the SIGINT handler below; left() checks it

    def left() -> float:
        if interrupted.is_set():  # a Ctrl-C that a Ray call swallowed still stops `up` at its next step
            raise KeyboardInterrupt
        rem = deadline - time.monotonic()
        if rem <= 0:
            raise EngineError(f"`up` did not finish within --timeout {opts.timeout:.0f} s",
                              fix="raise --timeout; the node logs stay under $SGLSEAT_HOME/logs/<seat>/")
        return rem

    rec = SeatRecord(
        name=plan.seat, state=SeatState.PLACING, engine=plan.engine, draft=plan.draft,
        cluster_address=spec.cluster.address, namespace=namespace_of(plan.seat), pg_name=pg_name(plan.seat),
        spec_source=spec.source, spec=spec.to_json(), bundles_dir=str(seat_bundles_dir(spec.name, spec.bundles.dir)),
        token_env=spec.cluster.token_env, busy_pid=os.getpid(), busy_host=host_id(),
        no_watchdog=opts.no_watchdog or not spec.watchdog.enabled,  # the spec's `watchdog.enabled: false` too
        kv_predicted=predicted_kv(plan), plan=plan.to_json(),
        on_hang=policy.on_hang, remediation_policy=policy.to_json(),
        nodes=[NodeRecord(node_rank=n.node_rank, agent=agent_name(plan.seat, n.node_rank)) for n in plan.nodes],
    )
    claim_record(rec)
    sess = _Session(rec)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    # Ctrl-C is remembered, not only raised: raised inside a Ray call it can be swallowed there, and `up` would go
    # on to READY after a SIGINT sent during its dist-init stage.
    previous = signal.signal(signal.SIGINT, on_sigint) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        _up_stages(spec, plan, backend, opts, sess, stages, left)
        if interrupted.is_set():
            raise KeyboardInterrupt
        return rec, stages.times
    except BaseException as exc:
        with sigint_ignored():
            survivors = teardown(sess.rec, connected=sess.connected, owns_ray=sess.owns_ray_objects,
                                  cluster_pid=sess.cluster_pid, cluster_ctime=sess.cluster_ctime)
        if survivors:
            sess.rec.set_state(SeatState.FAILED, "`up` failed and teardown left: " + "; ".join(survivors))
            save_record(sess.rec)
            if isinstance(exc, SeatError):
                exc.message += "\n  teardown left processes behind: " + "; ".join(survivors)
        else:
            remove_record(sess.rec.name)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if sess.connected:
            cluster.disconnect()


def _up_stages(spec: SeatSpec, plan: LaunchPlan, backend: EngineBackend, opts: UpOptions, sess: _Session,
               stages: Stages, left: Callable[[], float]) -> None:
    rec = sess.rec
    seat = plan.seat
    n = len(plan.nodes)

    if spec.cluster.address == "local":  # every node on this host: its ports checked before a cluster starts
        with stages.stage("ports", f"every port of the {n} nodes on this host"):
            held = local_port_failures(plan, backend, exporter=not rec.no_watchdog)
            if held is not None:
                raise held

    with stages.stage("cluster", spec.cluster.address) as note:
        address = spec.cluster.address
        if address == "local":
            lc_path = localcluster.cluster_record_path(seat)
            rec.local_cluster = True
            save_record(rec)
            lc = localcluster.start_local_cluster(
                seat, nodes=spec.cluster.nodes, gpus_per_node=spec.cluster.gpus_per_node,
                cpus_per_node=spec.cluster.cpus_per_node + 2, timeout=min(left(), LOCAL_CLUSTER_TIMEOUT_S),
                record=lc_path)
            sess.cluster_pid, sess.cluster_ctime = lc.pid, lc.create_time
            address = lc.gcs_address or ""
            note["detail"] = f"local, {spec.cluster.nodes} simulated nodes at {address} (holder pid {lc.pid})"
        rec.gcs_address = address
        save_record(rec)
        cluster.connect(address, rec.namespace, token_env=spec.cluster.token_env, timeout=min(left(), 60.0))
        sess.connected = True
        if not note["detail"]:
            note["detail"] = address

    with stages.stage("placement", f"{n} bundles, {plan.placement.strategy}") as note:
        existing = [r for r in range(n) if get_agent(seat, r) is not None]
        if existing or placement.find_group(rec.pg_name) is not None:
            raise SeatStateError(
                f"seat {seat!r} already has Ray objects in namespace {rec.namespace} (agents on nodes {existing}"
                f" or placement group {rec.pg_name}); a second `up` is refused",
                fix=f"run `sgl-seat down {seat}` where it was brought up, or pick another seat name",
            )
        sess.owns_ray_objects = True
        pg = placement.create_group(plan, rec.pg_name, timeout=left(), budget=opts.timeout)
        note["detail"] = "placed on nodes " + ", ".join(v[:8] for v in placement.bundle_nodes(pg).values())

    with stages.stage("agents", f"{n} node agents") as note:
        clients = _start_agents(spec, plan, pg)
        infos = call_all(clients, "node_info", lambda c: (), timeout=min(left(), 120.0))
        for node, inf in zip(rec.nodes, infos, strict=True):
            node.ip, node.node_id, node.host_id = inf["ip"], inf["node_id"], inf["host_id"]
            node.agent_pid, node.python, node.gpu_ids = inf["pid"], inf["python"], inf["gpu_ids"]
            node.log_path = inf["log_path"]
        node0 = infos[0]["ip"]
        plan = bind_plan(plan, backend, rec, infos)
        rec.plan = plan.to_json()
        rec.endpoint = endpoint_of(plan, node0, spec.network.host)
        save_record(rec)
        note["detail"] = f"node 0 at {node0}; GPUs " + " ".join(f"n{i['node_rank']}:{','.join(i['gpu_ids'])}"
                                                              for i in infos)
        if plan.hosts:
            note["detail"] += "; hosts " + " ".join(f"n{nd.node_rank}:{nd.host}" for nd in plan.nodes)
    plan_json = json.dumps(plan.to_json())

    with stages.stage("preflight", "every node"):
        exporters = {nd.node_rank: None if rec.no_watchdog else exporter_address(spec.watchdog.exporter_bind, nd.ip)
                     for nd in rec.nodes}
        found = call_all(clients, "preflight", lambda c: (plan_json, exporters[c.node_rank]),
                         timeout=min(left(), 60.0))
        failures = [Failure.from_dict(f) for fs in found for f in fs]
        if failures:
            raise preflight_error(failures)
    rec.set_state(SeatState.STARTING)
    save_record(rec)

    start_engines(rec, clients, plan, backend, stages, left)

    if not rec.no_watchdog:
        _sidecars_stage(rec, stages)
    rec.set_state(SeatState.READY)
    rec.reason = None
    rec.busy_pid = None
    save_record(rec)
    if not rec.no_watchdog and rec.on_hang != "capture":  # after READY: it writes the record itself from now on
        with stages.stage("supervisor", f"on a hang: {rec.on_hang}, once its bundle is on disk") as note:
            try:
                start_supervisor(SupervisorConfig(seat=seat, home=str(seat_home()), slots=opts.slots,
                                                  mem_fraction=opts.mem_fraction, faults=tuple(opts.faults)),
                                 rec.namespace, timeout=min(left(), 60.0))
                note["detail"] = f"{supervisor_name(seat)} on this node"
            except SeatError as exc:  # the seat serves and is watched; only its healing is missing: say so
                note["status"] = WARN
                note["detail"] = f"not started ({exc.message}): hangs are captured, not healed"








def _sidecars_stage(rec: SeatRecord, stages: Stages) -> None:
    with stages.stage("sidecars", "a watchdog sidecar on every node") as note:
        started = start_sidecars(context_of(rec))
        note["detail"] = started.detail
        if not started.ok:
            note["status"] = WARN  # the seat serves; it is just not watched




def endpoint_of(plan: LaunchPlan, node0_ip: str, host: str) -> str:
    """Rank 0's HTTP address: node 0's IP when the engine binds every interface, else the bound host."""
    addr = node0_ip if host in ("0.0.0.0", "::", "") else host
    return f"http://{'[' + addr + ']' if ':' in addr else addr}:{plan.http_port}"


def _start_agents(spec: SeatSpec, plan: LaunchPlan, pg: Any) -> list[AgentClient]:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote_cls = ray.remote(NodeAgent)
    clients = []
    for node in plan.nodes:
        r = node.node_rank
        create = remote_cls.options(
            name=agent_name(plan.seat, r), namespace=namespace_of(plan.seat), lifetime="detached",
            num_cpus=0, num_gpus=plan.topology.gpus_per_node, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=r, placement_group_capture_child_tasks=False),
        ).remote  # a named actor is registered with the GCS synchronously
        handle = bounded(f"creating node {r}'s agent", create, plan.seat, r, plan.engine, str(seat_home()),
                                 host_id())
        clients.append(AgentClient(handle, r))
    return clients






