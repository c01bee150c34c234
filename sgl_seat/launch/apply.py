"""`up`, `down`, `status` and `logs` as library calls: the only code that applies a plan to Ray.

``up`` goes stage by stage (cluster, placement, agents, preflight, node 0's engine, dist-init
reachability, the other engines, READY) and reports each stage's elapsed time through a
:class:`Reporter`. It either returns a READY seat or leaves nothing behind: any error, and Ctrl-C,
tear down what it created (the same teardown `down` runs) before the error is re-raised.

Everything the other commands need is found by name (``sgl_seat.launch.names``) and through the
local record (``sgl_seat.launch.record``), so each command is a fresh process that connects,
acts and disconnects. No call into Ray waits without a timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from sgl_seat.engines import EngineBackend, backend_for
from sgl_seat.engines.preflight import Failure, check_own_host, preflight_error
from sgl_seat.errors import ClusterError, EngineError, SeatError, SeatStateError
from sgl_seat.launch import cluster, health, localcluster, placement, procs
from sgl_seat.launch.agent import NodeAgent, tail_lines
from sgl_seat.launch.home import host_id, seat_home
from sgl_seat.launch.names import agent_name, namespace_of, pg_name
from sgl_seat.launch.record import (
    NodeRecord,
    RankRecord,
    SeatRecord,
    claim_record,
    load_record,
    remove_record,
    save_record,
)
from sgl_seat.launch.sidecars import SidecarContext, SidecarNode, start_sidecars, stop_sidecars
from sgl_seat.launch.state import SeatState
from sgl_seat.plan import LaunchPlan, Placeholder, build_plan
from sgl_seat.spec import SeatSpec

log = logging.getLogger(__name__)

CALL_TIMEOUT = 30.0
KILL_GRACE = 10.0
POLL_INTERVAL = 0.5


#: A stage's outcome: done, done with something the operator should know (e.g. no watchdog), or raised.
OK, WARN, FAILED = "ok", "warn", "failed"


class Reporter(Protocol):
    """Receives stage boundaries (the CLI prints them; the bench times them)."""

    def start(self, stage: str, detail: str) -> None: ...

    def finish(self, stage: str, seconds: float, detail: str, status: str = OK) -> None: ...


class NullReporter:
    def start(self, stage: str, detail: str) -> None:
        pass

    def finish(self, stage: str, seconds: float, detail: str, status: str = OK) -> None:
        pass


@dataclass(kw_only=True, slots=True)
class UpOptions:
    """`up`'s knobs; ``None`` means the spec's value."""

    draft: bool | None = None
    slots: int | None = None
    mem_fraction: float | None = None
    timeout: float = 600.0
    faults: tuple[str, ...] = ()
    no_watchdog: bool = False


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    seconds: float
    detail: str = ""
    status: str = OK

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 3), "status": self.status, "detail": self.detail}


@dataclass(slots=True)
class StageTimes:
    """Each stage in order (`up`'s and `down`'s result; the bench's raw data)."""

    records: list[Stage] = field(default_factory=list)

    @property
    def stages(self) -> list[tuple[str, float]]:
        return [(r.name, r.seconds) for r in self.records]

    def total(self) -> float:
        return sum(r.seconds for r in self.records)

    def warnings(self) -> list[Stage]:
        return [r for r in self.records if r.status != OK]


class _Stages:
    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.times = StageTimes()

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, str]]:
        """Time one stage; the body may set ``note["detail"]`` and ``note["status"]`` (WARN)."""
        note: dict[str, str] = {"detail": "", "status": OK}
        self.reporter.start(name, detail)
        t0 = time.monotonic()
        try:
            yield note
        except BaseException as exc:
            self._done(name, t0, note["detail"] or f"{type(exc).__name__}: {exc}".splitlines()[0], FAILED)
            raise
        self._done(name, t0, note["detail"], note["status"])

    def _done(self, name: str, t0: float, detail: str, status: str) -> None:
        rec = Stage(name, time.monotonic() - t0, detail, status)
        self.times.records.append(rec)
        self.reporter.finish(name, rec.seconds, detail, status)


# -- node agents from the driver ---------------------------------------------------------------


class AgentClient:
    """A node agent's handle: JSON in and out, and a timeout on every call."""

    def __init__(self, handle: Any, node_rank: int) -> None:
        self.handle = handle
        self.node_rank = node_rank

    def submit(self, method: str, *args: Any) -> Any:
        return getattr(self.handle, method).remote(*args)

    def wait(self, ref: Any, timeout: float, what: str) -> Any:
        return json.loads(cluster.get(ref, timeout, f"node {self.node_rank} agent ({what})"))

    def call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        return self.wait(self.submit(method, *args), timeout, method)


def _get_agent(seat: str, node_rank: int) -> AgentClient | None:
    import ray

    try:
        name = agent_name(seat, node_rank)
        return AgentClient(cluster.bounded(f"ray.get_actor({name!r})", ray.get_actor, name,
                                           namespace=namespace_of(seat)), node_rank)
    except ValueError:
        return None


def _call_all(clients: Sequence[AgentClient], method: str, args: Callable[[AgentClient], tuple[Any, ...]],
              timeout: float) -> list[Any]:
    """Call ``method`` on every agent at once and wait for all (each under ``timeout``)."""
    refs = [(c, c.submit(method, *args(c))) for c in clients]
    return [c.wait(ref, timeout, method) for c, ref in refs]


# -- state from the agents -----------------------------------------------------------------------


def _apply_engine_state(node: NodeRecord, st: dict[str, Any]) -> None:
    node.log_path = st.get("log_path") or node.log_path
    if not st.get("started"):
        return
    node.engine_pid = st["pid"]
    node.pgid = st["pgid"]
    node.alive = bool(st["alive"])
    node.returncode = st.get("returncode")
    node.processes = list(st.get("processes", []))
    node.pids = sorted({p["pid"] for p in node.processes} | ({node.engine_pid} if node.alive else set()))
    node.ranks = [RankRecord(**r) for r in st.get("ranks", [])]


def _dead_reason(states: Sequence[dict[str, Any]]) -> tuple[str, list[str]] | None:
    """Why the seat is dead: the node whose engine went first, then the others that followed."""
    dead = [st for st in states if st.get("started") and not st.get("alive")]
    if not dead:
        return None
    dead.sort(key=lambda st: (st.get("exited_at") or float("inf"), st["node_rank"]))
    first = dead[0]
    reason = str(first.get("reason") or f"node {first['node_rank']} engine is not alive")
    if len(dead) > 1:
        reason += "; then " + "; ".join(str(st.get("reason") or f"node {st['node_rank']}") for st in dead[1:])
    tail = [f"[node {first['node_rank']}] {ln}" for ln in first.get("log_tail", [])]
    return reason, tail


def _failure_text(reason: str, tail: Sequence[str]) -> str:
    return reason + ("\n  last log lines:\n    " + "\n    ".join(tail[-20:]) if tail else "")


# -- up --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Session:
    """What one `up` has created so far: what its teardown may touch."""

    rec: SeatRecord
    connected: bool = False
    owns_ray_objects: bool = False
    cluster_pid: int | None = None
    cluster_ctime: float | None = None


def _predicted_kv(plan: LaunchPlan) -> int | None:
    cap = plan.capacity
    if cap is None:
        return None
    return (cap.draft_on if plan.draft else cap.draft_off).kv_pool_tokens


def up(spec: SeatSpec, opts: UpOptions, reporter: Reporter | None = None) -> tuple[SeatRecord, StageTimes]:
    """Bring the seat up and return its READY record and stage times; on any failure leave nothing behind."""
    backend = backend_for(spec.engine)
    plan = build_plan(spec, draft=opts.draft, slots=opts.slots, mem_fraction=opts.mem_fraction, faults=opts.faults)
    stages = _Stages(reporter or NullReporter())
    deadline = time.monotonic() + opts.timeout

    def left() -> float:
        rem = deadline - time.monotonic()
        if rem <= 0:
            raise EngineError(f"`up` did not finish within --timeout {opts.timeout:.0f} s",
                              fix="raise --timeout; the node logs stay under $SGL_SEAT_HOME/logs/<seat>/")
        return rem

    rec = SeatRecord(
        name=plan.seat, state=SeatState.PLACING, engine=plan.engine, draft=plan.draft,
        cluster_address=spec.cluster.address, namespace=namespace_of(plan.seat), pg_name=pg_name(plan.seat),
        spec_source=spec.source, token_env=spec.cluster.token_env, busy_pid=os.getpid(), busy_host=host_id(),
        no_watchdog=opts.no_watchdog or not spec.watchdog.enabled,  # the spec's `watchdog.enabled: false` too
        kv_predicted=_predicted_kv(plan), plan=plan.to_json(),
        nodes=[NodeRecord(node_rank=n.node_rank, agent=agent_name(plan.seat, n.node_rank)) for n in plan.nodes],
    )
    claim_record(rec)
    sess = _Session(rec)
    try:
        _up_stages(spec, plan, backend, opts, sess, stages, left)
        return rec, stages.times
    except BaseException as exc:
        with _sigint_ignored():
            survivors = _teardown(sess.rec, connected=sess.connected, owns_ray=sess.owns_ray_objects,
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
        if sess.connected:
            cluster.disconnect()


def _up_stages(spec: SeatSpec, plan: LaunchPlan, backend: EngineBackend, opts: UpOptions, sess: _Session,
               stages: _Stages, left: Callable[[], float]) -> None:
    rec = sess.rec
    seat = plan.seat
    n = len(plan.nodes)

    with stages.stage("cluster", spec.cluster.address) as note:
        address = spec.cluster.address
        if address == "local":
            lc_path = localcluster.cluster_record_path(seat)
            rec.local_cluster = True
            save_record(rec)
            lc = localcluster.start_local_cluster(
                seat, nodes=spec.cluster.nodes, gpus_per_node=spec.cluster.gpus_per_node,
                cpus_per_node=spec.cluster.cpus_per_node + 2, timeout=min(left(), 120.0), record=lc_path)
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
        existing = [r for r in range(n) if _get_agent(seat, r) is not None]
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
        infos = _call_all(clients, "node_info", lambda c: (), timeout=min(left(), 120.0))
        for node, inf in zip(rec.nodes, infos, strict=True):
            node.ip, node.node_id, node.host_id = inf["ip"], inf["node_id"], inf["host_id"]
            node.agent_pid, node.python, node.gpu_ids = inf["pid"], inf["python"], inf["gpu_ids"]
            node.log_path = inf["log_path"]
        node0 = infos[0]["ip"]
        plan = _colocate(plan, backend, rec.nodes)
        plan = plan.fill({Placeholder.NODE0_ADDR: node0})
        rec.plan = plan.to_json()
        rec.endpoint = endpoint_of(plan, node0, spec.network.host)
        save_record(rec)
        note["detail"] = f"node 0 at {node0}; GPUs " + " ".join(f"n{i['node_rank']}:{','.join(i['gpu_ids'])}"
                                                              for i in infos)
    plan_json = json.dumps(plan.to_json())

    with stages.stage("preflight", "every node"):
        found = _call_all(clients, "preflight", lambda c: (plan_json,), timeout=min(left(), 60.0))
        failures = [Failure.from_dict(f) for fs in found for f in fs]
        if failures:
            raise preflight_error(failures)
    rec.set_state(SeatState.STARTING)
    save_record(rec)

    with stages.stage("engine-node0", "node 0 starts and listens on dist-init") as note:
        started = clients[0].call("start_engine", plan_json, timeout=min(left(), 60.0))
        _refresh_nodes(rec, clients[:1], timeout=CALL_TIMEOUT)
        save_record(rec)
        res = clients[0].call("wait_listening", node0, plan.dist_init_port, left(), timeout=left() + 10.0)
        if res.get("error"):
            dead = _dead_reason([res]) if "started" in res else None
            if dead:
                raise EngineError(_failure_text(*dead), fix=_logs_fix(rec))
            raise EngineError(f"node 0: {res['error']}", fix=_logs_fix(rec))
        note["detail"] = f"pid {started['pid']}, CUDA_VISIBLE_DEVICES={started['cuda_visible_devices']}"

    others = clients[1:]
    if others:
        with stages.stage("dist-init", f"{node0}:{plan.dist_init_port} from nodes 1..{n - 1}"):
            found = _call_all(others, "check_dist_init", lambda c: (node0, plan.dist_init_port, 5.0),
                              timeout=min(left(), 30.0))
            failures = [Failure.from_dict(f) for fs in found for f in fs]
            if failures:
                raise preflight_error(failures)
        with stages.stage("engines", f"nodes 1..{n - 1}"):
            _call_all(others, "start_engine", lambda c: (plan_json,), timeout=min(left(), 60.0))

    with stages.stage("ready", f"every rank alive and rank 0 {backend.health_path} = 200") as note:
        url = f"{rec.endpoint}{backend.health_path}"
        _wait_ready(rec, clients, url, left)
        note["detail"] = f"{sum(len(nd.ranks) for nd in rec.nodes)} ranks alive; {rec.endpoint}"

    if not rec.no_watchdog:
        _sidecars_stage(rec, stages)
    rec.set_state(SeatState.READY)
    rec.reason = None
    rec.busy_pid = None
    save_record(rec)


def _sidecars_stage(rec: SeatRecord, stages: _Stages) -> None:
    with stages.stage("sidecars", "a watchdog sidecar on every node") as note:
        started = start_sidecars(_sidecar_ctx(rec))
        note["detail"] = started.detail
        if not started.ok:
            note["status"] = WARN  # the seat serves; it is just not watched


def _colocate(plan: LaunchPlan, backend: EngineBackend, nodes: Sequence[NodeRecord]) -> LaunchPlan:
    """Give nodes that share a host with a lower node the engine's own-host environment (simulated nodes)."""
    first: dict[str, int] = {}
    extra: dict[int, dict[str, str]] = {}
    failures: list[Failure] = []
    for n in nodes:
        host = n.host_id or f"node {n.node_rank}"
        if host not in first:
            first[host] = n.node_rank
            continue
        env = backend.colocated_env(plan, n.node_rank)
        failures += check_own_host(n.node_rank, first[host], n.ip or host, env is not None)
        extra[n.node_rank] = env or {}
    if failures:
        raise preflight_error(failures)
    if not extra:
        return plan
    return replace(plan, nodes=tuple(
        replace(nd, env=tuple(sorted({**nd.env_dict(), **extra.get(nd.node_rank, {})}.items()))) for nd in plan.nodes
    ))


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
        handle = cluster.bounded(f"creating node {r}'s agent", create, plan.seat, r, plan.engine, str(seat_home()),
                                 host_id())
        clients.append(AgentClient(handle, r))
    return clients


def _refresh_nodes(rec: SeatRecord, clients: Sequence[AgentClient], timeout: float) -> list[dict[str, Any]]:
    states = _call_all(clients, "engine_state", lambda c: (), timeout=timeout)
    for st in states:
        _apply_engine_state(rec.nodes[st["node_rank"]], st)
        if st.get("node_rank") == 0 and st.get("kv_tokens") is not None:
            rec.kv_actual = st["kv_tokens"]
    return states


def _wait_ready(rec: SeatRecord, clients: Sequence[AgentClient], url: str, left: Callable[[], float]) -> None:
    last = "no answer yet"
    while True:
        states = _refresh_nodes(rec, clients, timeout=min(max(left(), 1.0), CALL_TIMEOUT))
        save_record(rec)
        dead = _dead_reason(states)
        if dead:
            raise EngineError(_failure_text(*dead), fix=_logs_fix(rec))
        unseen = [r["title"] for st in states for r in st.get("ranks", []) if r["pid"] is None]
        if unseen:
            last = f"ranks not running yet: {', '.join(unseen)}"
        else:
            code, err = health.probe(url, timeout=min(5.0, max(left(), 0.5)))
            if code == 200:
                return
            last = f"{url}: {err}"
        if deadline_passed(left):
            raise EngineError(f"the seat was not READY in time; last check: {last}",
                              fix="raise --timeout if it was still starting; " + _logs_fix(rec))
        time.sleep(POLL_INTERVAL)


def _logs_fix(rec: SeatRecord) -> str:
    """Where to read more once `up` has taken the seat down (the record is gone, the logs are not)."""
    paths = [f"node {n.node_rank}: {n.log_path}" for n in rec.nodes if n.log_path]
    return "the seat was taken down; its engine logs are kept: " + ("; ".join(paths) or "$SGL_SEAT_HOME/logs")


def deadline_passed(left: Callable[[], float]) -> bool:
    try:
        return left() <= POLL_INTERVAL
    except EngineError:
        return True


def _sidecar_ctx(rec: SeatRecord) -> SidecarContext:
    return SidecarContext(
        seat=rec.name, namespace=rec.namespace, pg_name=rec.pg_name, plan_json=json.dumps(rec.plan),
        nodes=tuple(SidecarNode(n.node_rank, n.agent, n.ip) for n in rec.nodes), spec_source=rec.spec_source,
    )


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Let teardown finish even if Ctrl-C is pressed again (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


# -- teardown (down, and a failed or interrupted up) -----------------------------------------------


def _same_host(node: NodeRecord) -> bool:
    return node.host_id is not None and node.host_id == host_id()


def _describe(node_rank: int, survivors: Sequence[dict[str, Any]]) -> list[str]:
    return [f"node {node_rank}: pid {s['pid']} ({s['title'][:80]})" for s in survivors]


def _local_kill(node: NodeRecord) -> list[str]:
    """Kill a node's engine group from here by recorded pgid/pids (its agent is gone; same host only)."""
    known = [(int(p["pid"]), float(p["create_time"])) for p in node.processes]
    left = procs.kill_group(node.pgid, (), known, timeout=KILL_GRACE)
    return _describe(node.node_rank, [s.to_dict() for s in left])


def _teardown(rec: SeatRecord, *, connected: bool, owns_ray: bool = True, cluster_pid: int | None = None,
              cluster_ctime: float | None = None, stages: _Stages | None = None) -> list[str]:
    """Stop everything of ``rec``; return what survived (empty: verified clean)."""
    st = stages or _Stages(NullReporter())
    survivors: list[str] = []
    reached: set[int] = set()
    if connected and owns_ray:
        try:
            _teardown_ray(rec, st, survivors, reached)
        except ClusterError as exc:  # Ray stopped answering: go on with what this host can do by pid
            log.warning("%s", exc)
            if not rec.local_cluster:  # a local cluster goes away with its holder below
                survivors.append(f"seat {rec.name}'s Ray objects could not be removed or checked: {exc.message}")
    if connected:
        cluster.disconnect()
    for node in rec.nodes:
        if node.node_rank not in reached and (node.pgid or node.processes):
            if _same_host(node):
                survivors += _local_kill(node)
            elif owns_ray:
                survivors.append(f"node {node.node_rank}: its agent did not answer; engine pgid {node.pgid} on"
                                 f" {node.ip} could not be checked")
    if rec.local_cluster:
        with st.stage("cluster", "local Ray cluster stopped") as note:
            lc = localcluster.load_cluster_record(localcluster.cluster_record_path(rec.name))
            pid = lc.pid if lc else cluster_pid
            if pid is not None:
                left = localcluster.stop_local_cluster(pid=pid, create_time=lc.create_time if lc else cluster_ctime,
                                                       known=lc.processes if lc else [])
                survivors += [f"local Ray cluster: pid {s.pid} ({s.title[:80]})" for s in left]
                note["detail"] = f"holder pid {pid} and its processes gone" if not left else "stragglers left"
                if not left:
                    localcluster.cluster_record_path(rec.name).unlink(missing_ok=True)
    # Final check on this host: nothing of any recorded engine group remains.
    for node in rec.nodes:
        if _same_host(node) and (node.pgid or node.processes):
            known = [(int(p["pid"]), float(p["create_time"])) for p in node.processes]
            still = [procs.info(p) for p in procs.members(node.pgid, (), known)]
            survivors += _describe(node.node_rank, [i.to_dict() for i in still if i is not None])
    return sorted(set(survivors))


def _teardown_ray(rec: SeatRecord, st: _Stages, survivors: list[str], reached: set[int]) -> None:
    """Through Ray: sidecars, each node's engine group (``reached``: the nodes that answered), agents, group."""
    with st.stage("engines", "SIGTERM, then SIGKILL, each engine process group") as note:
        if not rec.no_watchdog:
            try:
                stop_sidecars(_sidecar_ctx(rec))
            except Exception as exc:  # a sidecar bug must not keep engines alive
                log.warning("stopping sidecars failed: %s", exc)
        clients = [c for c in (_get_agent(rec.name, n.node_rank) for n in rec.nodes) if c is not None]
        refs = [(c, c.submit("kill_engine", KILL_GRACE)) for c in clients]
        for c, ref in refs:
            try:
                res = c.wait(ref, KILL_GRACE + 20.0, "kill_engine")
                survivors += _describe(c.node_rank, res["survivors"])
                reached.add(c.node_rank)
            except ClusterError as exc:
                log.warning("%s", exc)
        note["detail"] = f"{len(reached)} node(s) answered"
    with st.stage("agents", "node agents killed") as note:
        import ray

        for c in clients:
            with contextlib.suppress(Exception):
                cluster.bounded("ray.kill(agent)", ray.kill, c.handle, no_restart=True, timeout=10.0)
        note["detail"] = _wait_agents_gone(rec)
    with st.stage("placement", "placement group removed") as note:
        pg = placement.find_group(rec.pg_name)
        if pg is None:
            note["detail"] = "none left"
        elif placement.remove_group(pg):
            note["detail"] = "removed"
        else:
            survivors.append(f"placement group {rec.pg_name} is not REMOVED")


def _wait_agents_gone(rec: SeatRecord, timeout: float = 10.0) -> str:
    """Ray's kill is asynchronous: wait until the names are free (and, on this host, the pids gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        named = [n.node_rank for n in rec.nodes if _get_agent(rec.name, n.node_rank) is not None]
        local = [n for n in rec.nodes if _same_host(n) and n.agent_pid and procs.find(n.agent_pid) is not None]
        if not named and not local:
            return "gone"
        time.sleep(0.1)
    return "still shutting down"


class NotDown(EngineError):
    """`down` finished but something of the seat survived (``survivors``; ``times``: the stages it ran)."""

    def __init__(self, name: str, survivors: list[str], times: StageTimes) -> None:
        super().__init__(f"seat {name!r} is not fully down; still alive:\n  " + "\n  ".join(survivors),
                         fix="kill those pids by hand (they are the seat's own), then run `sgl-seat down` again")
        self.survivors = survivors
        self.times = times


def down(name: str, reporter: Reporter | None = None, *, timeout: float = 60.0) -> StageTimes:
    """Take seat ``name`` down on every node and verify; raise :class:`NotDown` naming any survivor."""
    rec = load_record(name)
    stages = _Stages(reporter or NullReporter())
    if rec.state in (SeatState.PLACING, SeatState.STARTING, SeatState.STOPPING) and _busy(rec):
        raise SeatStateError(f"another sgl-seat process (pid {rec.busy_pid}) is working on seat {name!r}"
                             f" ({rec.state.value})",
                             fix=f"wait for it, or interrupt it (`kill -INT {rec.busy_pid}`): an interrupted"
                                 " `up` takes the seat down itself")
    rec.set_state(SeatState.STOPPING)
    rec.busy_pid, rec.busy_host = os.getpid(), host_id()
    save_record(rec)
    connected = False
    with _sigint_ignored():
        if rec.gcs_address and (not rec.local_cluster or _holder_alive(rec)):
            with stages.stage("connect", rec.gcs_address):
                try:
                    cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=min(timeout, 30.0))
                    connected = True
                except ClusterError as exc:
                    log.warning("%s; checking recorded processes on this host only", exc)
        survivors = _teardown(rec, connected=connected, stages=stages)
    if survivors:
        rec.set_state(SeatState.FAILED, "`down` left: " + "; ".join(survivors))
        save_record(rec)
        raise NotDown(name, survivors, stages.times)
    rec.set_state(SeatState.STOPPED)
    remove_record(name)
    return stages.times


# -- status -------------------------------------------------------------------------------------------


def status(name: str, *, timeout: float = 20.0) -> SeatRecord:
    """Reconcile the local record with Ray, the agents and rank 0's health; save and return it."""
    rec = load_record(name)
    if rec.state in (SeatState.PLACING, SeatState.STARTING, SeatState.STOPPING):
        if _busy(rec):
            return rec  # `up` or `down` is still working on it and writes the record itself
        what = "`down`" if rec.state is SeatState.STOPPING else "`up`"
        _fail(rec, f"{what} (pid {rec.busy_pid}) ended before finishing ({rec.state.value}); run `sgl-seat down`")
    if not rec.gcs_address:
        save_record(rec)
        return rec
    if rec.local_cluster and not _holder_alive(rec):
        _fail(rec, "the local Ray cluster `up` started is gone (its holder process exited)")
        save_record(rec)
        return rec
    try:
        cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=timeout)
    except ClusterError as exc:
        _fail(rec, f"Ray cluster unreachable: {exc.message}")
        save_record(rec)
        return rec
    try:
        _reconcile(rec, timeout)
    finally:
        cluster.disconnect()
    save_record(rec)
    return rec


def _busy(rec: SeatRecord) -> bool:
    """Is the `up`/`down` process that last wrote the record still running (on this host)?"""
    return (rec.busy_pid is not None and rec.busy_host == host_id() and rec.busy_pid != os.getpid()
            and procs.find(rec.busy_pid) is not None)


def _fail(rec: SeatRecord, reason: str, tail: Sequence[str] = ()) -> None:
    if rec.state is SeatState.FAILED:
        return  # sticky: keep the first reason
    rec.set_state(SeatState.FAILED, reason)
    rec.log_tail = list(tail)


def _reconcile(rec: SeatRecord, timeout: float) -> None:
    clients: list[AgentClient] = []
    try:
        found = [(node, _get_agent(rec.name, node.node_rank)) for node in rec.nodes]
    except ClusterError as exc:
        _fail(rec, exc.message)
        return
    for node, c in found:
        if c is None:
            _fail(rec, f"node {node.node_rank} agent ({node.agent}) is gone")
            node.alive = False
        else:
            clients.append(c)
    states: list[dict[str, Any]] = []
    refs = [(c, c.submit("engine_state")) for c in clients]
    for c, ref in refs:
        try:
            st = c.wait(ref, timeout, "engine_state")
        except ClusterError as exc:
            _fail(rec, exc.message)
            continue
        states.append(st)
        _apply_engine_state(rec.nodes[c.node_rank], st)
        if c.node_rank == 0 and st.get("kv_tokens") is not None:
            rec.kv_actual = st["kv_tokens"]
    dead = _dead_reason(states)
    if dead:
        _fail(rec, dead[0], dead[1])
    if rec.state is SeatState.FAILED:
        return
    backend = backend_for(rec.engine)
    code, err = health.probe(f"{rec.endpoint}{backend.health_path}", timeout=5.0)
    if code == 200:
        rec.set_state(SeatState.READY)
        rec.reason = None
    else:
        rec.set_state(SeatState.DEGRADED, f"every engine process is alive but rank 0 {backend.health_path}: {err}")


def status_json(rec: SeatRecord) -> dict[str, Any]:
    """What `status --json` prints: the record's view of the seat (stable keys)."""
    return {
        "name": rec.name,
        "state": rec.state.value,
        "reason": rec.reason,
        "endpoint": rec.endpoint,
        "engine": rec.engine,
        "draft": rec.draft,
        "cluster": {"address": rec.cluster_address, "gcs_address": rec.gcs_address, "local": rec.local_cluster},
        "namespace": rec.namespace,
        "placement_group": rec.pg_name,
        "kv_pool": {"predicted": rec.kv_predicted, "actual": rec.kv_actual},
        "nodes": [
            {
                "node_rank": n.node_rank,
                "ip": n.ip,
                "node_id": n.node_id,
                "agent": n.agent,
                "agent_pid": n.agent_pid,
                "gpu_ids": n.gpu_ids,
                "engine_pid": n.engine_pid,
                "pgid": n.pgid,
                "alive": n.alive,
                "returncode": n.returncode,
                "log_path": n.log_path,
                "pids": n.pids,
                "ranks": [{"tp_rank": r.tp_rank, "ep_rank": r.ep_rank, "title": r.title, "pid": r.pid,
                           "alive": r.alive} for r in n.ranks],
            }
            for n in rec.nodes
        ],
        "log_tail": rec.log_tail,
        "updated_at": rec.updated_at,
    }


def _holder_alive(rec: SeatRecord) -> bool:
    lc = local_cluster_info(rec)
    return lc is not None and procs.find(lc.pid, lc.create_time) is not None


def local_cluster_info(rec: SeatRecord) -> localcluster.LocalClusterRecord | None:
    """The local cluster's record when `up` started one (tests and `down` use its pids)."""
    if not rec.local_cluster:
        return None
    return localcluster.load_cluster_record(localcluster.cluster_record_path(rec.name))


# -- logs ----------------------------------------------------------------------------------------------


def logs(name: str, *, node: int | None, follow: bool, lines: int, write: Callable[[str], None],
         poll: float = 0.5, stop: Callable[[], bool] = lambda: False) -> None:
    """Write the last ``lines`` of each node's log (or node ``node``), then follow new output if asked."""
    rec = load_record(name)
    nodes = [n for n in rec.nodes if node is None or n.node_rank == node]
    if not nodes:
        raise SeatStateError(f"seat {name!r} has no node {node}", fix=f"nodes are 0..{len(rec.nodes) - 1}")
    prefix = len(nodes) > 1
    connected = False
    if rec.gcs_address:
        try:
            cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=20.0)
            connected = True
        except ClusterError as exc:
            log.warning("%s", exc)
    try:
        offsets: dict[int, int] = {}
        partial: dict[int, str] = {}
        clients: dict[int, AgentClient] = {}
        for n in nodes:
            c = _get_agent(name, n.node_rank) if connected else None
            if c is None:
                if n.log_path and _same_host(n):
                    for ln in tail_lines(Path(n.log_path), lines):
                        write(_prefixed(n.node_rank, ln, prefix))
                    continue
                raise ClusterError(f"node {n.node_rank}'s agent cannot be reached and its log is on {n.ip}",
                                   fix="run `sgl-seat logs` on that node, or check `sgl-seat status`")
            res = c.call("log_tail", lines, timeout=CALL_TIMEOUT)
            for ln in res["lines"]:
                write(_prefixed(n.node_rank, ln, prefix))
            offsets[n.node_rank] = int(res["size"])
            clients[n.node_rank] = c
        while follow and clients and not stop():
            for r, c in list(clients.items()):
                try:
                    res = c.call("read_log", offsets[r], timeout=CALL_TIMEOUT)
                except ClusterError as exc:
                    write(f"[node {r}] -- {exc.message}")
                    del clients[r]
                    continue
                offsets[r] = int(res["offset"])
                *complete, partial[r] = (partial.get(r, "") + res["data"]).split("\n")
                for ln in complete:
                    write(_prefixed(r, ln, prefix))
            time.sleep(poll)
    finally:
        if connected:
            cluster.disconnect()


def _prefixed(node_rank: int, line: str, prefix: bool) -> str:
    return f"[node {node_rank}] {line}" if prefix else line
