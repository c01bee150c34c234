"""The driver's side of the node agents: a handle with a timeout on every call, and what their answers mean.

Agents are found by name (``sgl_seat.launch.seatrecord.names``) in the seat's namespace; every call takes and returns
JSON (``sgl_seat.launch.actors.agent``). :func:`apply_engine_state` folds an agent's engine state into the seat's
record and :func:`dead_reason` says which node's engine went first when several are dead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.launch import cluster
from sgl_seat.launch.seatrecord.names import agent_name, namespace_of
from sgl_seat.launch.seatrecord.record import NodeRecord, RankRecord, SeatRecord

CALL_TIMEOUT = 30.0


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


def get_agent(seat: str, node_rank: int) -> AgentClient | None:
    import ray

    try:
        name = agent_name(seat, node_rank)
        return AgentClient(bounded(f"ray.get_actor({name!r})", ray.get_actor, name,
                                           namespace=namespace_of(seat)), node_rank)
    except ValueError:
        return None


def call_all(clients: Sequence[AgentClient], method: str, args: Callable[[AgentClient], tuple[Any, ...]],
              timeout: float) -> list[Any]:
    """Call ``method`` on every agent at once and wait for all (each under ``timeout``)."""
    refs = [(c, c.submit(method, *args(c))) for c in clients]
    return [c.wait(ref, timeout, method) for c, ref in refs]


def apply_engine_state(node: NodeRecord, st: dict[str, Any]) -> None:
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


def refresh_nodes(rec: SeatRecord, clients: Sequence[AgentClient], timeout: float) -> list[dict[str, Any]]:
    states = call_all(clients, "engine_state", lambda c: (), timeout=timeout)
    for st in states:
        apply_engine_state(rec.nodes[st["node_rank"]], st)
        if st.get("node_rank") == 0 and st.get("kv_tokens") is not None:
            rec.kv_actual = st["kv_tokens"]
    return states


def dead_reason(states: Sequence[dict[str, Any]]) -> tuple[str, list[str]] | None:
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


def failure_text(reason: str, tail: Sequence[str]) -> str:
    return reason + ("\n  last log lines:\n    " + "\n    ".join(tail[-20:]) if tail else "")
