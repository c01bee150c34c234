"""`status` with a node agent gone (issue 24, item 3, measured on the local sim seat: a SIGKILLed agent leaves its
engines serving): the reason says what the node's watchdog sees of its engines, and how they can be stopped."""

from __future__ import annotations

from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.status import agent_gone


def _rec() -> tuple[SeatRecord, NodeRecord]:
    node = NodeRecord(node_rank=1, agent="sgl-seat-ka-node1", ip="127.0.0.1", agent_pid=1279, engine_pid=1351)
    rec = SeatRecord(name="ka", state=SeatState.READY, engine="sim", draft=False, cluster_address="auto",
                     namespace="ns", pg_name="pg", nodes=[NodeRecord(node_rank=0, agent="a0"), node])
    return rec, node


def _proc(pid: int, alive: bool, node: int = 1) -> dict[str, object]:
    return {"node": node, "pid": pid, "title": "sglang::scheduler_TP2", "rank": 2, "alive": alive}


def test_engines_alive_as_the_watchdog_sees_them_are_named_with_how_to_stop_them() -> None:
    rec, node = _rec()
    line, alive = agent_gone(rec, node, {"node": 1, "processes": [_proc(1351, True), _proc(1354, True)]})
    assert line.startswith("node 1 agent (sgl-seat-ka-node1, pid 1279) is gone; ")
    assert "engine processes alive (pids 1351, 1354): they go on serving" in line
    assert "`sgl-seat down ka`" in line and "`sgl-seat down --local ka`" in line
    assert alive  # the engines are: the node's alive flag is set from this


def test_engines_gone_or_unseen_are_said_so() -> None:
    rec, node = _rec()
    line, alive = agent_gone(rec, node, {"node": 1, "processes": [_proc(1351, True), _proc(1354, False)]})
    assert line.endswith("its watchdog sees engine processes gone (pids 1354)") and not alive
    line, alive = agent_gone(rec, node, {"node": 1, "error": "ActorDiedError: the actor died"})
    assert line.endswith("its engines unseen (ActorDiedError: the actor died)") and not alive
    assert "its engines unseen (its sidecar sees no engine process)" in agent_gone(rec, node, None)[0]
    # another node's processes are not this node's
    line, alive = agent_gone(rec, node, {"node": 1, "processes": [_proc(7, True, node=0)]})
    assert "unseen" in line and not alive
