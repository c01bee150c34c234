"""Starting a seat's engines under agents that are already placed: bind the plan to where Ray put each node,
start node 0 and the others, and wait until every rank is alive and rank 0 answers its health check.

`up` runs this once its agents have passed preflight; the supervisor (:mod:`sgl_seat.launch.actors.supervisor`)
runs it again to restart the engines after a hang. It sits below both, so neither imports the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sgl_seat.engines import EngineBackend
from sgl_seat.engines import preflight_facts as facts
from sgl_seat.engines.preflight import (
    EXPORTER_PORT,
    Failure,
    check_own_host,
    check_ports_distinct,
    check_ports_free,
    preflight_error,
)
from sgl_seat.errors import EngineError, PreflightError
from sgl_seat.launch import health
from sgl_seat.launch.agentclient import CALL_TIMEOUT, AgentClient, call_all, dead_reason, failure_text, refresh_nodes
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, save_record
from sgl_seat.launch.stages import WARN, Stages
from sgl_seat.plan import LaunchPlan, NodePlan, Placeholder
from sgl_seat.watchdog.config import metrics_port_for

#: How far `up` looks for a free --port-base to suggest, from the seat's own ports (in steps of PORT_BASE_STEP).
PORT_BASE_STEP, PORT_BASE_TRIES = 20, 100

POLL_INTERVAL = 0.5


def predicted_kv(plan: LaunchPlan) -> int | None:
    cap = plan.capacity
    if cap is None:
        return None
    return (cap.draft_on if plan.draft else cap.draft_off).kv_pool_tokens


def bind_plan(plan: LaunchPlan, backend: EngineBackend, rec: SeatRecord, infos: Sequence[dict[str, Any]]
              ) -> LaunchPlan:
    """The plan bound to where Ray put each node (``infos``: the agents' ``node_info``): per-host settings follow
    the host Ray actually chose for each bundle (cluster.hosts), simulated nodes sharing a host get the engine's
    own-host environment, and node 0's address is filled in. `up` binds its plan so, and the supervisor a plan
    rebuilt with the draft off."""
    plan = plan.bind_hosts({i["node_rank"]: (i["ip"], i.get("hostname")) for i in infos})
    for node, planned in zip(rec.nodes, plan.nodes, strict=True):
        node.host = planned.host
    plan = _colocate(plan, backend, rec.nodes)
    return plan.fill({Placeholder.NODE0_ADDR: infos[0]["ip"]})


def node_ports(plan: LaunchPlan, backend: EngineBackend, node: NodePlan, *, exporter: bool
               ) -> dict[str, tuple[int, str]]:
    """Every port ``node`` binds on its host, by name: its engine's (:meth:`EngineBackend.listen_ports`) and, with
    ``exporter`` (the watchdog on), its sidecar's metrics exporter's; each with the address it binds (the exporter's
    on loopback here: where `up` checks it for a local cluster; the agent checks it where the spec says)."""
    out = {what: (p, backend.bind_host(node.command, what)) for what, p in backend.listen_ports(plan, node).items()}
    metrics = metrics_port_for(plan.http_port, node.node_rank) if exporter else 0
    if metrics:
        out[EXPORTER_PORT] = (metrics, "127.0.0.1")
    return out


def local_port_failures(plan: LaunchPlan, backend: EngineBackend, *, exporter: bool) -> PreflightError | None:
    """For a seat whose nodes all run on this host (``cluster.address: local``): every port of every node, checked
    before anything starts (a local cluster takes seconds to start; the agents' preflight would find a held port
    only after it). Ports held by another process, and ports the seat's own nodes would share, are failures; where
    a port is held, the error's fix names a ``--port-base`` at which every port of the seat is free now."""
    nodes = [NodeRecord(node_rank=n.node_rank, agent="", host_id="this host", ip="127.0.0.1") for n in plan.nodes]
    bound = _colocate(plan, backend, nodes).fill({Placeholder.NODE0_ADDR: "127.0.0.1"})
    ports = {n.node_rank: node_ports(bound, backend, n, exporter=exporter) for n in bound.nodes}
    failures = check_ports_distinct([(r, what, p) for r, named in ports.items() for what, (p, _) in named.items()])
    every = [(p, host) for named in ports.values() for p, host in named.values()]
    holders = {p: facts.port_holder(p, host) for p, host in every}
    for r, named in ports.items():
        failures += check_ports_free(r, {what: p for what, (p, _) in named.items()}, holders)
    if not failures:
        return None
    err = preflight_error(failures)
    if any(holders.values()):
        for k in range(1, PORT_BASE_TRIES + 1):
            shift = k * PORT_BASE_STEP
            if all(p + shift <= 65535 and facts.port_holder(p + shift, host) is None for p, host in every):
                err.fix = (f"stop what holds the port(s) above, or run with `--port-base {plan.http_port + shift}`: "
                           "every port of this seat is free there now")
                break
    return err


def start_engines(rec: SeatRecord, clients: Sequence[AgentClient], plan: LaunchPlan, backend: EngineBackend,
                  stages: Stages, left: Callable[[], float]) -> None:
    """Start every node's engine from the filled ``plan`` and wait until the seat is ready (every rank alive and
    rank 0's health 200). `up` calls it once its agents have passed preflight, and the seat's supervisor again
    to restart the engines after a hang (:mod:`sgl_seat.launch.actors.supervisor`), under the agents `up` started."""
    n = len(plan.nodes)
    node0 = rec.nodes[0].ip or ""
    plan_json = json.dumps(plan.to_json())
    others = list(clients[1:])
    together = bool(others) and backend.start_nodes_together
    listen = backend.startup_port(plan)
    with stages.stage("engine-node0", f"node 0 starts and listens on {listen}"
                      + (f" (nodes 1..{n - 1} start beside it)" if together else "")) as note:
        started = clients[0].call("start_engine", plan_json, timeout=min(left(), 60.0))
        starts = [started]
        if together:  # each node imports its engine meanwhile; they wait for node 0's dist-init themselves
            starts += call_all(others, "start_engine", lambda c: (plan_json,), timeout=min(left(), 60.0))
        refresh_nodes(rec, clients[:1] if not together else clients, timeout=CALL_TIMEOUT)
        save_record(rec)
        res = clients[0].call("wait_listening", node0, listen, left(), timeout=left() + 10.0)
        if res.get("error"):
            dead = dead_reason([res]) if "started" in res else None
            if dead:
                raise EngineError(failure_text(*dead), fix=_logs_fix(rec), node=0)
            raise EngineError(f"node 0: {res['error']}", fix=_logs_fix(rec), node=0)
        note["detail"] = f"pid {started['pid']}, CUDA_VISIBLE_DEVICES={started['cuda_visible_devices']}"
        _niceness_warning(note, starts)

    if others:
        with stages.stage("dist-init", f"{node0}:{plan.dist_init_port} from nodes 1..{n - 1}"):
            found = call_all(others, "check_dist_init", lambda c: (node0, plan.dist_init_port, 5.0),
                              timeout=min(left(), 30.0))
            failures = [Failure.from_dict(f) for fs in found for f in fs]
            if failures:
                raise preflight_error(failures)
        if not together:
            with stages.stage("engines", f"nodes 1..{n - 1}") as note:
                _niceness_warning(note, call_all(others, "start_engine", lambda c: (plan_json,),
                                                 timeout=min(left(), 60.0)))

    with stages.stage("ready", f"every rank alive and rank 0 {backend.health_path} = 200") as note:
        url = f"{rec.endpoint}{backend.health_path}"
        _wait_ready(rec, clients, url, left)
        note["detail"] = f"{sum(len(nd.ranks) for nd in rec.nodes)} ranks alive; {rec.endpoint}"


def _niceness_warning(note: dict[str, str], starts: list[dict[str, Any]]) -> None:
    """An engine left at Ray's worker niceness serves, but loses the CPU to the rest of its host: say so."""
    notes = sorted({s["niceness_note"] for s in starts if s.get("niceness_note")})
    if notes:
        note["status"] = WARN
        note["detail"] = "; ".join([note.get("detail", ""), *notes]).lstrip("; ")


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
        replace(nd, env=tuple(sorted({**nd.env_dict(), **extra[nd.node_rank]}.items())),
                command=backend.colocated_argv(plan, nd.node_rank, nd.command) or nd.command)
        if nd.node_rank in extra else nd
        for nd in plan.nodes
    ))


def _wait_ready(rec: SeatRecord, clients: Sequence[AgentClient], url: str, left: Callable[[], float]) -> None:
    last = "no answer yet"
    while True:
        states = refresh_nodes(rec, clients, timeout=min(max(left(), 1.0), CALL_TIMEOUT))
        save_record(rec)
        dead = dead_reason(states)
        if dead:
            raise EngineError(failure_text(*dead), fix=_logs_fix(rec), node=_first_dead(states))
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


def _first_dead(states: Sequence[dict[str, Any]]) -> int | None:
    """The node whose engine went first (the one :func:`dead_reason` names first)."""
    dead = [st for st in states if st.get("started") and not st.get("alive")]
    first = min(dead, key=lambda st: (st.get("exited_at") or float("inf"), st["node_rank"]), default=None)
    return None if first is None else int(first["node_rank"])


def _logs_fix(rec: SeatRecord) -> str:
    """Where to read more once `up` has taken the seat down (the record is gone, the logs are not)."""
    paths = [f"node {n.node_rank}: {n.log_path}" for n in rec.nodes if n.log_path]
    return "the seat was taken down; its engine logs are kept: " + ("; ".join(paths) or "$SGLSEAT_HOME/logs")


def deadline_passed(left: Callable[[], float]) -> bool:
    try:
        return left() <= POLL_INTERVAL
    except EngineError:
        return True
