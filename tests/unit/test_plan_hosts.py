"""Per-host settings (issue 11): the spec names hosts, and each node gets the env of the host Ray put it on.

Ray decides which host holds node rank 0; per-rank env (``network.node_env``) was wrong on every other
`up`. These tests feed :meth:`LaunchPlan.bind_hosts` both placements and check the env follows the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sgl_seat.engines.preflight import check_host_interfaces
from sgl_seat.errors import PlanError, SpecError
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.status import status_json
from sgl_seat.plan import PIN_AMOUNT, LaunchPlan, build_plan, render_text
from sgl_seat.spec import SeatSpec, builtin_seats_dir, parse_spec

HOST_A = {"name": "a", "address": "198.18.0.1", "env": {"GLOO_SOCKET_IFNAME": "ethA0", "NCCL_IB_HCA": "mlx5_0"},
          "interfaces": ["ethA0"]}
HOST_B = {"name": "b", "address": "hostb.example", "env": {"GLOO_SOCKET_IFNAME": "ethB0", "NCCL_IB_HCA": "mlx5_1"}}


def _doc(**cluster: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((builtin_seats_dir() / "local-sim.yaml").read_text())
    doc["network"].pop("node_env")
    doc["cluster"].update(cluster)
    return doc


def _spec(doc: dict[str, Any]) -> SeatSpec:
    return parse_spec(yaml.safe_dump(doc), path=str(builtin_seats_dir() / "local-sim.yaml"))


def test_hosts_parse_and_pin_goes_into_the_bundle() -> None:
    a = {**HOST_A, "ray_resource": "sgl-host-a", "node_rank": 0}
    plan = build_plan(_spec(_doc(hosts=[a, HOST_B])))
    bundles = plan.placement.bundle_dicts()
    assert bundles[0]["sgl-host-a"] == PIN_AMOUNT
    assert "sgl-host-a" not in bundles[1]
    assert [h.name for h in plan.hosts] == ["a", "b"]
    text = render_text(plan)
    assert "host a (198.18.0.1): node 0, pinned by resource sgl-host-a" in text
    assert "host b (hostb.example): whichever node rank Ray places there" in text
    assert "env GLOO_SOCKET_IFNAME=ethB0" in text
    assert "node 0 (HTTP) on host a (pinned;" in text and "node 1 on the host Ray picks" in text


@pytest.mark.parametrize("order", [("198.18.0.1", "198.18.0.9"), ("198.18.0.9", "198.18.0.1")])
def test_env_follows_the_host_ray_chose(order: tuple[str, str]) -> None:
    plan = build_plan(_spec(_doc(hosts=[HOST_A, HOST_B])))
    ip0, ip1 = order
    # Host a is matched on its IP, host b on its hostname (its spec entry names no IP).
    names: dict[str, tuple[str | None, str | None]] = {"198.18.0.1": ("198.18.0.1", None),
                                                       "198.18.0.9": ("198.18.0.9", "hostb.example")}
    bound = plan.bind_hosts({0: names[ip0], 1: names[ip1]})
    want = {"198.18.0.1": ("a", "ethA0", "mlx5_0"), "198.18.0.9": ("b", "ethB0", "mlx5_1")}
    for nd, addr in zip(bound.nodes, order, strict=True):
        host, gloo, hca = want[addr]
        assert nd.host == host
        assert nd.env_dict()["GLOO_SOCKET_IFNAME"] == gloo  # the host's env wins over network.env ('lo')
        assert nd.env_dict()["NCCL_IB_HCA"] == hca
        assert nd.env_dict()["SGLSEAT_NAME"] == "local-sim"
    # The binding survives the JSON trip to the node agents.
    again = LaunchPlan.from_json(bound.to_json())
    assert [(n.host, n.expect_interfaces, n.env) for n in again.nodes] == [
        (n.host, n.expect_interfaces, n.env) for n in bound.nodes]
    assert again.hosts == bound.hosts


def test_bind_refuses_unknown_address_two_nodes_on_one_host_and_a_broken_pin() -> None:
    plan = build_plan(_spec(_doc(hosts=[HOST_A, HOST_B])))
    with pytest.raises(PlanError, match=r"node 1 is at 10\.0\.0\.7 \(h7\), which matches no"):
        plan.bind_hosts({0: ("198.18.0.1", None), 1: ("10.0.0.7", "h7")})
    with pytest.raises(PlanError, match="both landed on host 'a'"):
        plan.bind_hosts({0: ("198.18.0.1", None), 1: ("198.18.0.1", None)})
    pinned = build_plan(_spec(_doc(hosts=[{**HOST_A, "ray_resource": "ra", "node_rank": 1}, HOST_B])))
    with pytest.raises(PlanError, match="pinned to host 'a' but Ray put it on 'b'"):
        pinned.bind_hosts({0: ("198.18.0.1", None), 1: ("x", "hostb.example")})


def test_plan_without_hosts_is_unchanged() -> None:
    doc = yaml.safe_load((builtin_seats_dir() / "local-sim.yaml").read_text())
    plan = build_plan(_spec(doc))
    assert "hosts" not in plan.to_json()
    assert plan.bind_hosts({0: ("1.2.3.4", None)}) is plan


@pytest.mark.parametrize(("hosts", "extra", "match"), [
    ([HOST_A, HOST_B], {"network_node_env": True}, "both set"),
    ([{**HOST_A, "node_rank": 0}, HOST_B], {}, "names no ray_resource"),
    ([HOST_A, {**HOST_B, "address": "198.18.0.1"}], {}, r"address \['198.18.0.1'\] given more than once"),
    ([HOST_A], {}, "names 1 hosts for 2 nodes"),
    ([{**HOST_A, "ray_resource": "r", "node_rank": 2}, HOST_B], {}, "pins node rank 2, but the seat has 2 nodes"),
    ([{**HOST_A, "env": {"SGLSEAT_NAME": "x"}}, HOST_B], {}, "set by sgl-seat itself"),
])
def test_malformed_hosts(hosts: list[dict[str, Any]], extra: dict[str, Any], match: str) -> None:
    doc = _doc(hosts=hosts)
    if extra.get("network_node_env"):
        doc["network"]["node_env"] = [{}, {}]
    with pytest.raises(SpecError, match=match):
        _spec(doc)


def test_host_interface_expectation() -> None:
    assert check_host_interfaces(1, "b", ["ethB0"], ["lo", "ethB0"]) == []
    (fail,) = check_host_interfaces(1, "b", ["ethB0"], ["lo", "ethA0"])
    assert fail.node_rank == 1 and "host 'b' should have interfaces ['ethB0']" in fail.problem


def test_status_json_reports_each_nodes_address_and_host(tmp_path: Path) -> None:
    rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="198.18.0.1:6390",
                     namespace="ns", pg_name="pg",
                     nodes=[NodeRecord(node_rank=0, agent="a0", ip="198.18.0.2", host="b"),
                            NodeRecord(node_rank=1, agent="a1", ip="198.18.0.1", host="a")])
    nodes = status_json(rec)["nodes"]
    assert [(n["address"], n["host"]) for n in nodes] == [("198.18.0.2", "b"), ("198.18.0.1", "a")]
    again = SeatRecord.from_dict(rec.to_dict())
    assert [n.host for n in again.nodes] == ["b", "a"]
