"""`status` as a library call: reconcile the local record with Ray, the agents and rank 0's health.

The local record is a cache that can drift from Ray (DESIGN: ``status`` reconciles it): a seat whose `up`
or `down` died half-way, whose local cluster is gone, whose agents or engines died, or whose rank 0 does not
answer its health route is marked FAILED or DEGRADED here, with the reason. ``status_json`` is what
``status --json`` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sgl_seat.engines import backend_for
from sgl_seat.errors import ClusterError
from sgl_seat.launch import cluster, health
from sgl_seat.launch.agentclient import AgentClient, apply_engine_state, dead_reason, get_agent
from sgl_seat.launch.record import SeatRecord, load_record, save_record
from sgl_seat.launch.state import SeatState
from sgl_seat.launch.teardown import busy, holder_alive


def status(name: str, *, timeout: float = 20.0) -> SeatRecord:
    """Reconcile the local record with Ray, the agents and rank 0's health; save and return it."""
    rec = load_record(name)
    if rec.state in (SeatState.PLACING, SeatState.STARTING, SeatState.STOPPING):
        if busy(rec):
            return rec  # `up` or `down` is still working on it and writes the record itself
        what = "`down`" if rec.state is SeatState.STOPPING else "`up`"
        _fail(rec, f"{what} (pid {rec.busy_pid}) ended before finishing ({rec.state.value}); run `sgl-seat down`")
    if not rec.gcs_address:
        save_record(rec)
        return rec
    if rec.local_cluster and not holder_alive(rec):
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


def _fail(rec: SeatRecord, reason: str, tail: Sequence[str] = ()) -> None:
    if rec.state is SeatState.FAILED:
        return  # sticky: keep the first reason
    rec.set_state(SeatState.FAILED, reason)
    rec.log_tail = list(tail)


def _reconcile(rec: SeatRecord, timeout: float) -> None:
    clients: list[AgentClient] = []
    try:
        found = [(node, get_agent(rec.name, node.node_rank)) for node in rec.nodes]
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
        apply_engine_state(rec.nodes[c.node_rank], st)
        if c.node_rank == 0 and st.get("kv_tokens") is not None:
            rec.kv_actual = st["kv_tokens"]
    dead = dead_reason(states)
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
