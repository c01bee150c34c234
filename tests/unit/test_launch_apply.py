"""Driver-side pieces of `up`/`status` that need no Ray: co-located nodes, the endpoint, who died first,
the `status --json` shape, and the environment Ray reads (one-host mode, token auth)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sgl_seat.engines import backend_for
from sgl_seat.engines.base import argv_value
from sgl_seat.errors import ClusterError, PreflightError
from sgl_seat.launch import cluster
from sgl_seat.launch.agentclient import dead_reason
from sgl_seat.launch.bringup import _colocate
from sgl_seat.launch.seatrecord.record import NodeRecord, RankRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.status import hang_of, status_json
from sgl_seat.launch.up import endpoint_of
from sgl_seat.plan import build_plan
from sgl_seat.spec import load_spec


def _nodes(*hosts: str) -> list[NodeRecord]:
    return [NodeRecord(node_rank=i, agent=f"a{i}", host_id=h, ip="127.0.0.1") for i, h in enumerate(hosts)]


def test_simulated_nodes_on_one_host_get_their_own_listen_port() -> None:
    """GIVEN two sim nodes on one host WHEN the plan is adjusted THEN node 1 listens elsewhere (SGLang's dummy
    health server would otherwise collide with node 0's HTTP port) and its preflight checks that port."""
    plan = build_plan(load_spec("local-sim"))
    sim = backend_for("sim")
    out = _colocate(plan, sim, _nodes("h/1", "h/1"))
    assert "SGLSEAT_SIM_NODE_PORT" not in out.nodes[0].env_dict()
    assert out.nodes[1].env_dict()["SGLSEAT_SIM_NODE_PORT"] == str(plan.http_port + 10)
    assert sim.listen_ports(out, out.nodes[1]) == {"http": plan.http_port + 10, "sim admin": plan.http_port + 12}
    assert sim.listen_ports(out, out.nodes[0])["dist_init"] == plan.dist_init_port
    assert _colocate(plan, sim, _nodes("h/1", "h/2")) is plan


def test_real_engine_nodes_on_one_host_fail_preflight() -> None:
    plan = build_plan(load_spec("large"))
    with pytest.raises(PreflightError, match="node 1: own-host"):
        _colocate(plan, backend_for("sglang"), _nodes("h/1", "h/1"))


def test_endpoint_is_node0_unless_the_engine_binds_one_address() -> None:
    plan = build_plan(load_spec("local-sim"))
    assert endpoint_of(plan, "10.0.0.5", "0.0.0.0") == f"http://10.0.0.5:{plan.http_port}"
    assert endpoint_of(plan, "10.0.0.5", "127.0.0.1") == f"http://127.0.0.1:{plan.http_port}"
    assert endpoint_of(plan, "fe80::1", "::") == f"http://[fe80::1]:{plan.http_port}"


def _st(rank: int, alive: bool, exited_at: float | None = None, reason: str | None = None) -> dict[str, Any]:
    return {"node_rank": rank, "started": True, "alive": alive, "exited_at": exited_at, "reason": reason,
            "log_tail": [f"tail {rank}"]}


def test_the_node_that_died_first_is_the_reason() -> None:
    """Node 0's engine kills itself when node 1's ranks vanish; the reason must name node 1."""
    assert dead_reason([_st(0, True), _st(1, True)]) is None
    got = dead_reason([_st(0, False, 10.2, "node 0 engine killed by SIGKILL"),
                        _st(1, False, 10.0, "node 1 engine killed by SIGKILL")])
    assert got is not None
    reason, tail = got
    assert reason.startswith("node 1 engine killed by SIGKILL; then node 0") and tail == ["[node 1] tail 1"]


def test_status_json_has_the_documented_keys() -> None:
    rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=True, cluster_address="local",
                     namespace="n", pg_name="p", endpoint="http://127.0.0.1:1",
                     nodes=[NodeRecord(node_rank=0, agent="a", ranks=[RankRecord(tp_rank=0, ep_rank=0, title="t",
                                                                                 pid=5, alive=True)])])
    doc = status_json(rec)
    assert {"name", "state", "endpoint", "nodes", "kv_pool", "reason"} <= set(doc)
    assert doc["nodes"][0]["node_rank"] == 0 and doc["nodes"][0]["ranks"][0]["pid"] == 5
    assert doc["kv_pool"]["actual_source"].startswith("synthetic"), "a sim seat's pool is not a measurement"
    assert doc["hang"] is None


def test_status_json_of_a_hung_seat_names_the_bundle() -> None:
    rec = SeatRecord(name="s", state=SeatState.HUNG, engine="sglang", draft=True, cluster_address="local",
                     namespace="n", pg_name="p", hang_bundle="20261130-1-row-fetch-stall-r3",
                     hang_verdict="row-fetch stall rank 3 node 1")
    doc = status_json(rec)
    assert doc["state"] == "HUNG"
    assert doc["hang"] == {"bundle": "20261130-1-row-fetch-stall-r3", "verdict": "row-fetch stall rank 3 node 1"}
    assert doc["kv_pool"]["actual_source"].startswith("measured")


_BUNDLE = {"capture_id": "c1", "bundle_id": "B1", "path": "/x/B1",
           "verdict": {"kind": "row-fetch stall", "rank": 3, "node": 1, "frame": "fetch_rows (rowfetch.py:65)"}}


@pytest.mark.parametrize(("snaps", "want"), [
    ([{"node": 0, "latched": False, "bundles": []}, {"node": 1, "latched": False}], None),
    # an old capture's bundle on record but nobody latched: recovered, not hung
    ([{"node": 0, "latched": False, "latched_by": None, "bundles": [_BUNDLE]}], None),
    # node 1 holds the latch of capture c1; node 0 coordinated it and holds the bundle
    ([{"node": 0, "latched": True, "latched_by": "c1", "bundles": [_BUNDLE]},
      {"node": 1, "latched": True, "latched_by": "c1", "bundles": []}],
     ("B1", "row-fetch stall rank 3 node 1 fetch_rows (rowfetch.py:65)")),
    # latched, the capture still being written: hung, no bundle yet
    ([{"node": 0, "latched": True, "latched_by": "pending", "bundles": [_BUNDLE]}, {"node": 1, "error": "x"}],
     (None, None)),
])
def test_hang_of_reads_the_latch_and_finds_its_bundle(snaps: list[dict[str, Any]],
                                                      want: tuple[str | None, str | None] | None) -> None:
    assert hang_of(snaps) == want


def test_token_auth_is_passed_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_RAY_TOKEN", "s3cret")
    monkeypatch.setenv("RAY_AUTH_MODE", "unset-by-test")  # recorded, so the test's changes are undone
    monkeypatch.setenv("RAY_AUTH_TOKEN", "unset-by-test")
    cluster.prepare_env("10.1.2.3:6379", "MY_RAY_TOKEN")
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_AUTH_TOKEN"] == "s3cret"
    monkeypatch.delenv("NOT_SET_TOKEN", raising=False)
    with pytest.raises(ClusterError, match="NOT_SET_TOKEN is not set"):
        cluster.prepare_env("10.1.2.3:6379", "NOT_SET_TOKEN")


def test_addresses() -> None:
    assert cluster.is_loopback("local") and cluster.is_loopback("127.0.0.1:6379")
    assert not cluster.is_loopback("10.0.0.1:6379") and not cluster.is_loopback("auto")
    assert cluster.split_address("[::1]:6379") == ("::1", 6379)
    with pytest.raises(ClusterError, match="not host:port"):
        cluster.split_address("head-node")


def test_fault_route_comes_from_the_backend() -> None:
    """The sim's run-time fault route is its loopback admin port; real SGLang takes no injected faults."""
    from sgl_seat.sim.front import ports

    plan = build_plan(load_spec("local-sim"), draft=True)
    node = plan.nodes[0]
    assert backend_for("sim").fault_url(plan, node) == \
        f"http://127.0.0.1:{ports.admin_port(plan.http_port)}/sim/faults"
    assert backend_for("sglang").fault_url(plan, node) is None


def test_cpu_engine_nodes_on_one_host_share_it_with_their_own_port() -> None:
    """GIVEN the local-sglang seat (SGLang's CPU engine) on one host WHEN the plan is adjusted THEN node 1 moves
    its --port (its dummy health server binds it) and no preflight failure is raised."""
    plan = build_plan(load_spec("local-sglang"))
    out = _colocate(plan, backend_for("sglang"), _nodes("h/1", "h/1"))
    assert argv_value(out.nodes[0].command, "--port") == str(plan.http_port)
    assert argv_value(out.nodes[1].command, "--port") == str(plan.http_port + 10)
