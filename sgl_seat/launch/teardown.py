"""Teardown: `down`, and what a failed or interrupted `up` runs before it re-raises.

Through Ray when the cluster answers (sidecars, each node's engine process group, the agents, the
placement group), then by recorded pid on this host for whatever Ray could not reach, then the local Ray
cluster if `up` started one; finally every recorded engine group on this host is checked again. What
survived is returned (or raised as :class:`NotDown`), never hidden.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.errors import ClusterError, EngineError, HomeError, SeatError, SeatStateError
from sgl_seat.launch import cluster, localcluster, placement, procs
from sgl_seat.launch.agentclient import get_agent
from sgl_seat.launch.home import host_id
from sgl_seat.launch.record import NodeRecord, SeatRecord, load_record, record_path, remove_record, save_record
from sgl_seat.launch.sidecars import context_of, stop_sidecars
from sgl_seat.launch.stages import NullReporter, Reporter, Stages, StageTimes
from sgl_seat.launch.state import SeatState
from sgl_seat.launch.supervisor import stop_supervisor

log = logging.getLogger(__name__)

KILL_GRACE = 10.0


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Let teardown finish even if Ctrl-C is pressed again (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def same_host(node: NodeRecord) -> bool:
    return node.host_id is not None and node.host_id == host_id()


def _describe(node_rank: int, survivors: Sequence[dict[str, Any]]) -> list[str]:
    return [f"node {node_rank}: pid {s['pid']} ({s['title'][:80]})" for s in survivors]


def _local_kill(node: NodeRecord) -> list[str]:
    """Kill a node's engine group from here by recorded pgid/pids (its agent is gone; same host only)."""
    known = [(int(p["pid"]), float(p["create_time"])) for p in node.processes]
    left = procs.kill_group(node.pgid, (), known, timeout=KILL_GRACE)
    return _describe(node.node_rank, [s.to_dict() for s in left])


def teardown(rec: SeatRecord, *, connected: bool, owns_ray: bool = True, cluster_pid: int | None = None,
              cluster_ctime: float | None = None, stages: Stages | None = None) -> list[str]:
    """Stop everything of ``rec``; return what survived (empty: verified clean)."""
    st = stages or Stages(NullReporter())
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
            if same_host(node):
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
                    try:
                        localcluster.cluster_record_path(rec.name).unlink(missing_ok=True)
                    except OSError as exc:  # a read-only home: the cluster is gone all the same
                        log.warning("the local cluster's record could not be removed: %s", exc)
    # Final check on this host: nothing of any recorded engine group remains.
    for node in rec.nodes:
        if same_host(node) and (node.pgid or node.processes):
            known = [(int(p["pid"]), float(p["create_time"])) for p in node.processes]
            still = [procs.info(p) for p in procs.members(node.pgid, (), known)]
            survivors += _describe(node.node_rank, [i.to_dict() for i in still if i is not None])
    return sorted(set(survivors))


def _teardown_ray(rec: SeatRecord, st: Stages, survivors: list[str], reached: set[int]) -> None:
    """Through Ray: the supervisor, sidecars, each node's engine group (``reached``: the nodes that answered),
    agents, group. The supervisor goes first: it must not take the engines going down for a hang to heal."""
    try:
        if rec.on_hang != "capture":  # only then did `up` start one
            stop_supervisor(rec.name, rec.namespace)
    except ClusterError as exc:  # a wedged GCS: the rest of the teardown says what it could not check either
        log.warning("stopping the supervisor failed: %s", exc)
    except SeatError as exc:
        survivors.append(exc.message)
    with st.stage("engines", "SIGTERM, then SIGKILL, each engine process group") as note:
        if not rec.no_watchdog:
            try:
                stop_sidecars(context_of(rec))
            except Exception as exc:  # a sidecar bug must not keep engines alive
                log.warning("stopping sidecars failed: %s", exc)
        clients = [c for c in (get_agent(rec.name, n.node_rank) for n in rec.nodes) if c is not None]
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
                bounded("ray.kill(agent)", ray.kill, c.handle, no_restart=True, timeout=10.0)
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
        named = [n.node_rank for n in rec.nodes if get_agent(rec.name, n.node_rank) is not None]
        local = [n for n in rec.nodes if same_host(n) and n.agent_pid and procs.find(n.agent_pid) is not None]
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
    stages = Stages(reporter or NullReporter())
    if rec.state in (SeatState.PLACING, SeatState.STARTING, SeatState.STOPPING) and busy(rec):
        raise SeatStateError(f"another sgl-seat process (pid {rec.busy_pid}) is working on seat {name!r}"
                             f" ({rec.state.value})",
                             fix=f"wait for it, or interrupt it (`kill -INT {rec.busy_pid}`): an interrupted"
                                 " `up` takes the seat down itself")
    rec.set_state(SeatState.STOPPING)
    rec.busy_pid, rec.busy_host = os.getpid(), host_id()
    # A home that takes no write (full, read-only) must not keep a seat up: the record is read, so everything
    # it names can be stopped; what could not be written is said at the end.
    unsaved = _try_save(rec)
    connected = False
    with sigint_ignored():
        if rec.gcs_address and (not rec.local_cluster or holder_alive(rec)):
            with stages.stage("connect", rec.gcs_address):
                try:
                    cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=min(timeout, 30.0))
                    connected = True
                except ClusterError as exc:
                    log.warning("%s; checking recorded processes on this host only", exc)
        survivors = teardown(rec, connected=connected, stages=stages)
    if survivors:
        rec.set_state(SeatState.FAILED, "`down` left: " + "; ".join(survivors))
        _try_save(rec)
        raise NotDown(name, survivors, stages.times)
    rec.set_state(SeatState.STOPPED)
    try:
        remove_record(name)
    except HomeError as exc:
        raise HomeError(f"seat {name!r} is down (every process it started is gone), but " + exc.message
                        + (f"; earlier: {unsaved.message}" if unsaved else ""),
                        fix=f"remove {record_path(name)} by hand once the home takes writes (`sgl-seat status` "
                            "shows the seat until then)") from None
    return stages.times


def _try_save(rec: SeatRecord) -> HomeError | None:
    """Save the record, or log and return why it could not be (`down` goes on: stopping matters more)."""
    try:
        save_record(rec)
    except HomeError as exc:
        log.warning("%s", exc.message)
        return exc
    return None


def busy(rec: SeatRecord) -> bool:
    """Is the `up`/`down` process that last wrote the record still running (on this host)?"""
    return (rec.busy_pid is not None and rec.busy_host == host_id() and rec.busy_pid != os.getpid()
            and procs.find(rec.busy_pid) is not None)


def holder_alive(rec: SeatRecord) -> bool:
    lc = local_cluster_info(rec)
    return lc is not None and procs.find(lc.pid, lc.create_time) is not None


def local_cluster_info(rec: SeatRecord) -> localcluster.LocalClusterRecord | None:
    """The local cluster's record when `up` started one (tests and `down` use its pids)."""
    if not rec.local_cluster:
        return None
    return localcluster.load_cluster_record(localcluster.cluster_record_path(rec.name))
