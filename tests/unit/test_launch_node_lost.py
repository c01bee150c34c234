"""`status` tells a lost node (NODE-LOST) from a hang (HUNG) and a dead engine (FAILED) (issue 11).

The agents are fakes at the `get_agent` seam: node 1's call times out the way ``cluster.get`` reports a
silent node (:class:`~sgl_seat.launch.cluster.NoAnswer`); node 0 answers with every rank alive.
"""

from __future__ import annotations

from typing import Any

import pytest

from sgl_seat.errors import ClusterError
from sgl_seat.launch import status
from sgl_seat.launch.cluster import NoAnswer
from sgl_seat.launch.seatrecord.record import NodeRecord, RankRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState


class _Agent:
    def __init__(self, node_rank: int, answer: dict[str, Any] | Exception) -> None:
        self.node_rank = node_rank
        self.answer = answer

    def submit(self, method: str, *args: Any) -> str:
        return method

    def wait(self, ref: Any, timeout: float, what: str) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _alive(node: int) -> dict[str, Any]:
    ranks = [{"tp_rank": 2 * node + i, "ep_rank": 2 * node + i, "title": f"sglang::scheduler_TP{2 * node + i}",
              "pid": 100 + i, "alive": True} for i in range(2)]
    return {"node_rank": node, "started": True, "alive": True, "pid": 99, "pgid": 99, "ranks": ranks,
            "processes": [], "reason": None}


def _rec() -> SeatRecord:
    nodes = [NodeRecord(node_rank=n, agent=f"a{n}", ip=f"198.18.0.{n + 1}", host="ab"[n],
                        ranks=[RankRecord(tp_rank=r, ep_rank=r, title=f"sglang::scheduler_TP{r}")
                               for r in (2 * n, 2 * n + 1)]) for n in range(2)]
    return SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="198.18.0.1:6390",
                      namespace="n", pg_name="p", endpoint="http://198.18.0.1:1", nodes=nodes, no_watchdog=True)


def _run(monkeypatch: pytest.MonkeyPatch, answers: dict[int, dict[str, Any] | Exception]) -> SeatRecord:
    monkeypatch.setattr(status, "get_agent", lambda seat, r: _Agent(r, answers[r]))
    monkeypatch.setattr(status.health, "probe", lambda url, timeout: (200, None))
    rec = _rec()
    status._reconcile(rec, timeout=1.0)
    return rec


def test_a_silent_node_is_node_lost_with_its_address_host_and_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _run(monkeypatch, {0: _alive(0), 1: NoAnswer("node 1 agent (engine_state) did not answer within 1 s")})
    assert rec.state is SeatState.NODE_LOST
    assert rec.reason == ("node 1 (198.18.0.2, host b; ranks 2, 3) unreachable: node 1 agent (engine_state) did not"
                          " answer within 1 s")
    assert status.status_json(rec)["state"] == "NODE-LOST"


def test_when_the_node_answers_again_the_seat_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _run(monkeypatch, {0: _alive(0), 1: _alive(1)})
    assert rec.state is SeatState.READY
    assert SeatState.NODE_LOST.can_become(SeatState.READY)


def test_other_ray_errors_and_dead_engines_stay_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _run(monkeypatch, {0: _alive(0), 1: ClusterError("node 1 agent (engine_state) failed: boom")})
    assert rec.state is SeatState.FAILED
    dead = {**_alive(0), "alive": False, "returncode": -9, "reason": "node 0 engine (pid 99) was killed"}
    rec = _run(monkeypatch, {0: dead, 1: NoAnswer("silent")})
    assert rec.state is SeatState.FAILED  # a dead engine is the finding; the silent node does not hide it


@pytest.mark.parametrize(("exc", "lost"), [
    ("timeout", True),
    ("unavailable", True),
    ("node-died", True),
    ("worker-died", False),
])
def test_which_ray_errors_mean_the_node_is_lost(monkeypatch: pytest.MonkeyPatch, exc: str, lost: bool) -> None:
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

    from sgl_seat.launch import cluster

    errors = {
        "timeout": GetTimeoutError(),
        "unavailable": ActorUnavailableError("unreachable", None),
        "node-died": RayActorError(error_msg="The actor died because its node has died. Node Id: 0a1b"),
        "worker-died": RayActorError(error_msg="The actor is dead because its worker process has died."),
    }

    def get(ref: Any, timeout: float) -> Any:
        raise errors[exc]

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(ClusterError) as info:
        cluster.get(object(), 1.0, "node 1 agent (engine_state)")
    assert isinstance(info.value, NoAnswer) is lost
