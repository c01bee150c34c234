"""Teardown: `down`, and what a failed or interrupted `up` runs before it re-raises.

Through Ray when the cluster answers (sidecars, each node's engine process group, the agents, the
placement group), then by recorded pid on this host for whatever Ray could not reach, then the local Ray
cluster if `up` started one; finally every recorded engine group on this host is checked again. What
survived is returned (or raised as :class:`NotDown`), never hidden.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.engines import preflight_facts
from sgl_seat.errors import ClusterError, EngineError, HomeError, SeatError, SeatStateError
from sgl_seat.launch import cluster, placement
from sgl_seat.launch.actors.supervisor import stop_supervisor
from sgl_seat.launch.agentclient import get_agent
from sgl_seat.launch.host import localcluster, processgroups
from sgl_seat.launch.seatrecord.home import host_id, seats_dir
from sgl_seat.launch.seatrecord.record import (
    NodeRecord,
    SeatRecord,
    list_names,
    load_record,
    record_path,
    remove_record,
    save_record,
)
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import context_of, stop_sidecars
from sgl_seat.launch.stages import NullReporter, Reporter, Stages, StageTimes

log = logging.getLogger(__name__)

KILL_GRACE = 10.0
#: Seconds each node's agent has to answer `down`'s first call. A node that does not (its raylet or host gone, its
#: link down) is left out of everything that follows, so `down` is bounded (issue 24: <= 20 s with one node
#: unreachable) and names it, with its recorded pids, instead of waiting out every later call's timeout.
REACH_S = 3.0
#: Seconds `down` waits to connect to the cluster before it goes on by pid on this host alone (a dead GCS: 30 s
#: measured with the old bound, against 1-3 s for a connect on the loaded two-namespace cluster).
CONNECT_S = 15.0


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
    """Is ``node`` on this host: the same kernel (host id) and, where its address is recorded, that address one of
    this host's own. Why the address too: two network namespaces share a kernel (and every pid) but are two hosts
    to the seat, and `down --local` on one of them must stop that host's node alone."""
    if node.host_id is None or node.host_id != host_id():
        return False
    return node.ip is None or node.ip in preflight_facts.local_addresses()


def _describe(node_rank: int, survivors: Sequence[dict[str, Any]]) -> list[str]:
    return [f"node {node_rank}: pid {s['pid']} ({s['title'][:80]})" for s in survivors]


def _known(node: NodeRecord) -> list[tuple[int, float]]:
    """The node's recorded engine processes as (pid, create time): what pids are checked against."""
    return [(int(p["pid"]), float(p["create_time"])) for p in node.processes]


def _local_kill(node: NodeRecord) -> list[str]:
    """Kill a node's engine group from here by recorded pgid/pids (its agent is gone; same host only)."""
    left = processgroups.kill_group(node.pgid, (), _known(node), timeout=KILL_GRACE)
    return _describe(node.node_rank, [s.to_dict() for s in left])


def teardown(rec: SeatRecord, *, connected: bool, owns_ray: bool = True, cluster_pid: int | None = None,
              cluster_ctime: float | None = None, stages: Stages | None = None) -> list[str]:
    """Stop everything of ``rec``; return what survived (empty: verified clean)."""
    st = stages or Stages(NullReporter())
    survivors: list[str] = []
    reached: set[int] = set()
    unreachable: dict[int, str] = {}
    if connected and owns_ray:
        try:
            _teardown_ray(rec, st, survivors, reached, unreachable)
        except ClusterError as exc:  # Ray stopped answering: go on with what this host can do by pid
            log.warning("%s", exc)
            if not rec.local_cluster:  # a local cluster goes away with its holder below
                survivors.append(f"seat {rec.name}'s Ray objects could not be removed or checked: {exc.message}")
    if connected:
        cluster.disconnect()
    by_pid = [n for n in rec.nodes if n.node_rank not in reached and (n.pgid or n.processes) and same_host(n)]
    if by_pid:
        # Their keepers first (a node whose raylet is gone has its keeper watching in its sidecar's place): one left
        # watching would take the engines killed next for a crash and capture it.
        from sgl_seat.watchdog.keeper import stop_local_keepers

        stopped = stop_local_keepers(rec.name, {n.node_rank for n in by_pid})
        if stopped:
            log.info("stopped the keepers %s of node(s) %s", stopped, [n.node_rank for n in by_pid])
    for node in rec.nodes:
        if node.node_rank not in reached and (node.pgid or node.processes):
            if same_host(node):
                survivors += _local_kill(node)
            elif owns_ray:
                survivors.append(unreachable_line(rec, node, unreachable.get(node.node_rank)))
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
            still = [processgroups.info(p) for p in processgroups.members(node.pgid, (), _known(node))]
            survivors += _describe(node.node_rank, [i.to_dict() for i in still if i is not None])
    return sorted(set(survivors))


def unreachable_line(rec: SeatRecord, node: NodeRecord, why: str | None) -> str:
    """What `down` says of a node it could not reach: which, why, what it left running there, and how to finish."""
    where = node.ip or "its host"
    if node.host:
        where += f", host {node.host}"
    pids = f"pids {', '.join(map(str, node.pids))}" if node.pids else "no pid recorded"
    return (f"node {node.node_rank} ({where}) unreachable ({why or 'its agent did not answer'}): its engine "
            f"(pgid {node.pgid}, {pids}) was not stopped; run `sgl-seat down --local {rec.name}` on that host, or "
            f"`sgl-seat down {rec.name}` again once it answers (the record is kept)")


#: Why `down` skips a node whose agent actor Ray no longer knows (killed, say): its node may be well, and its sidecar
#: is still stopped (it removes the node's probe rings), unlike a node that does not answer.
AGENT_NOT_FOUND = "its agent is not found in Ray"


def _reach(rec: SeatRecord) -> tuple[list[Any], dict[int, str]]:
    """Every node's agent asked at once, each under what is left of REACH_S: (the clients that answered, node ->
    why not, for the others)."""
    from sgl_seat.launch.agentclient import AgentClient

    why: dict[int, str] = {}
    clients: list[AgentClient] = []
    for n in rec.nodes:
        c = get_agent(rec.name, n.node_rank)  # a ClusterError here is the GCS's, not the node's: teardown says so
        if c is None:
            why[n.node_rank] = AGENT_NOT_FOUND
        else:
            clients.append(c)
    refs = [(c, c.submit("engine_state")) for c in clients]
    deadline = time.monotonic() + REACH_S
    ok: list[AgentClient] = []
    for c, ref in refs:
        try:
            c.wait(ref, max(0.1, deadline - time.monotonic()), "engine_state")
            ok.append(c)
        except ClusterError as exc:
            why[c.node_rank] = f"no answer in {REACH_S:g} s: {exc.message.splitlines()[0][:160]}"
    return ok, why


def _teardown_ray(rec: SeatRecord, st: Stages, survivors: list[str], reached: set[int],
                  unreachable: dict[int, str]) -> None:
    """Through Ray: the supervisor, sidecars, each node's engine group (``reached``: the nodes that answered),
    agents, group. The supervisor goes first: it must not take the engines going down for a hang to heal. Nodes
    whose agent does not answer within REACH_S are left out of every step (``unreachable``: node -> why)."""
    try:
        if rec.on_hang != "capture":  # only then did `up` start one
            stop_supervisor(rec.name, rec.namespace)
    except ClusterError as exc:  # a wedged GCS: the rest of the teardown says what it could not check either
        log.warning("stopping the supervisor failed: %s", exc)
    except SeatError as exc:
        survivors.append(exc.message)
    with st.stage("reach", f"each node's agent asked (at most {REACH_S:g} s)") as note:
        clients, why = _reach(rec)
        unreachable.update(why)
        note["detail"] = (f"{len(clients)} of {len(rec.nodes)} answered" +
                          "".join(f"; node {n}: {w}" for n, w in sorted(why.items())))
    answered = {c.node_rank for c in clients}
    with st.stage("engines", "SIGTERM, then SIGKILL, each engine process group") as note:
        if not rec.no_watchdog:
            # The sidecars of the nodes that answered, and of those whose agent alone is gone (an unreachable node
            # would cost the stop's timeout). A sidecar not stopped dies with the placement group, its rings left.
            # Those of the latter get REACH_S to answer: a sidecar that died with its raylet cannot.
            brief = {n for n, w in why.items() if w == AGENT_NOT_FOUND}
            stop = answered | brief
            try:
                ctx = context_of(rec, settings=False)
                stop_sidecars(dataclasses.replace(ctx, nodes=tuple(n for n in ctx.nodes if n.node_rank in stop)),
                              brief=brief, brief_s=REACH_S)
            except Exception as exc:  # a sidecar bug must not keep engines alive
                log.warning("stopping sidecars failed: %s", exc)
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
        note["detail"] = _wait_agents_gone(rec, answered)
    with st.stage("placement", "placement group removed") as note:
        pg = placement.find_group(rec.pg_name)
        if pg is None:
            note["detail"] = "none left"
        elif placement.remove_group(pg):
            note["detail"] = "removed"
        else:
            survivors.append(f"placement group {rec.pg_name} is not REMOVED")


def _wait_agents_gone(rec: SeatRecord, nodes: set[int], timeout: float = 10.0) -> str:
    """Ray's kill is asynchronous: wait until the names of ``nodes``' agents are free (and, on this host, the pids
    gone)."""
    deadline = time.monotonic() + timeout
    mine = [n for n in rec.nodes if n.node_rank in nodes]
    while time.monotonic() < deadline:
        named = [n.node_rank for n in mine if get_agent(rec.name, n.node_rank) is not None]
        local = [n for n in mine if same_host(n) and n.agent_pid and processgroups.find(n.agent_pid) is not None]
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


def nothing_to_take_down(name: str | None) -> str | None:
    """What `down` says when there is nothing to take down, else None. `down` is idempotent: with no seat recorded
    (no NAME), or none named NAME, it is done already (a second `down`, or one after a failed `up` took its seat
    down), so it says so and exits 0, named or not, ``--local`` or not; a NAME not recorded lists the seats that are,
    in case of a typo. Several recorded and no NAME is not this: `resolve_name` refuses it (exit 2), as `down` does
    not guess which seat to take down."""
    names = list_names()
    if name is None:
        return None if names else f"no seat is recorded in {seats_dir()}: nothing to take down"
    if record_path(name).exists():
        return None
    return (f"no seat named {name!r} is recorded in {seats_dir()}: nothing to take down"
            + (f" (recorded: {', '.join(names)})" if names else ""))


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
                    cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env,
                                    timeout=min(timeout, CONNECT_S))
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


@dataclasses.dataclass(frozen=True)
class LocalDown:
    """What `down --local` did on this host: per node, what it stopped and what is still alive."""

    seat: str
    nodes: tuple[int, ...]
    stopped: dict[int, list[int]]
    survivors: list[str]
    saved: bool
    #: The pids of this host's sidecar keepers that it stopped (``watchdog.keeper``: their sidecars are out of reach).
    keepers: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """`down --local --json`'s document."""
        return {"seat": self.seat, "local": True, "nodes": list(self.nodes),
                "stopped": {str(k): v for k, v in self.stopped.items()}, "survivors": self.survivors,
                "keepers_stopped": list(self.keepers), "record_saved": self.saved}

    def refuse_survivors(self) -> None:
        """Raise :class:`EngineError` naming what is still alive, if anything is."""
        if self.survivors:
            raise EngineError("still alive after `down --local`:\n  " + "\n  ".join(self.survivors),
                              fix="kill those pids by hand (they are the seat's own), then run `sgl-seat down "
                                  "--local` again")


def down_local(name: str) -> LocalDown:
    """`down --local`: on this host and without Ray, stop the engine process groups of the seat's nodes that run
    here, from the pids and process groups in the seat's record (their create times guard against reused pids).

    Why: a node whose agent or link is gone cannot be reached by `down`, and its engines may still run there (with
    its raylet killed they did not: Ray ends a dying worker's children, the agent's engines among them). The record
    keeps what was stopped (a node with no process left), so a later
    `down` from the driver skips it and removes the rest (sidecars, agents, the placement group, the record).
    """
    rec = load_record(name)
    mine = [n for n in rec.nodes if same_host(n)]
    if not mine:
        where = ", ".join(f"node {n.node_rank}: {n.ip or '?'}" + (f" (host {n.host})" if n.host else "")
                          for n in rec.nodes)
        raise SeatError(f"no node of seat {name!r} runs on this host ({where})",
                        fix="run `sgl-seat down --local` on the host of the node to stop, with this seat's record "
                            "(SGLSEAT_HOME) readable there")
    stopped: dict[int, list[int]] = {}
    survivors: list[str] = []
    with sigint_ignored():
        from sgl_seat.watchdog.keeper import stop_local_keepers

        keepers = stop_local_keepers(name, {n.node_rank for n in mine})
        for node in mine:
            alive = [p.pid for p in processgroups.members(node.pgid, (), _known(node))]
            left = _local_kill(node) if (node.pgid or node.processes) else []
            stopped[node.node_rank] = alive
            survivors += left
            if not left:  # nothing of this node's engine is left: `down` has nothing to stop there any more
                node.pgid, node.processes, node.pids, node.alive = None, [], [], False
    if survivors:
        why = "`down --local` left: " + "; ".join(survivors)
    else:
        why = (f"`down --local` stopped node(s) {', '.join(str(n.node_rank) for n in mine)} on this host; run "
               "`sgl-seat down` to remove the rest")
    if rec.state.can_become(SeatState.FAILED) and rec.state is not SeatState.FAILED:
        rec.set_state(SeatState.FAILED, why)  # not serving whole any more, whatever it was
    else:
        rec.reason, rec.updated_at = why, time.time()
    saved = _try_save(rec) is None
    return LocalDown(seat=name, nodes=tuple(n.node_rank for n in mine), stopped=stopped,
                     survivors=sorted(set(survivors)), saved=saved, keepers=tuple(keepers))


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
            and processgroups.find(rec.busy_pid) is not None)


def holder_alive(rec: SeatRecord) -> bool:
    lc = local_cluster_info(rec)
    return lc is not None and processgroups.find(lc.pid, lc.create_time) is not None


def local_cluster_info(rec: SeatRecord) -> localcluster.LocalClusterRecord | None:
    """The local cluster's record when `up` started one (tests and `down` use its pids)."""
    if not rec.local_cluster:
        return None
    return localcluster.load_cluster_record(localcluster.cluster_record_path(rec.name))
