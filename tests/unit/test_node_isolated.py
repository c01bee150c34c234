"""A node cut off by its own link names itself (issue 24, item 1): ``node-isolated`` from its own evidence, while
its healthy peer names it ``node-unreachable``; `replay` and `bundle merge` reach the same node offline.

The links are a sysfs tree of the test's own (``operstate`` and ``carrier`` files, as the kernel writes them for a
veth whose peer went down: tests/integration/test_netns_cluster.py cuts a real link); the peers are stand-ins for
the Ray heartbeats.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sgl_seat.core.isolation import HeadReach, LinkState, RdmaPort, SelfCheck, checks_from_json, own_side_gone
from sgl_seat.core.nodeloss import loss_verdict
from sgl_seat.core.records import VerdictKind
from sgl_seat.forensics.format.bundle import read_bundle
from sgl_seat.forensics.format.merge import merge_bundles
from sgl_seat.forensics.replay.redetect import rerun_detectors
from sgl_seat.netports import held
from sgl_seat.watchdog import selfcheck
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import LINK_DOWN_S, Sidecar

RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def _link(root: Path, name: str, operstate: str, carrier: str | None) -> None:
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "operstate").write_text(operstate + "\n")
    if carrier is None:
        (d / "carrier").unlink(missing_ok=True)  # an administratively down link: carrier unreadable
    else:
        (d / "carrier").write_text(carrier + "\n")


# ---- the rule


def _check(links: tuple[LinkState, ...] = (), rdma: tuple[RdmaPort, ...] = (), head: HeadReach | None = None,
           silent: dict[int, str] | None = None, peers: int = 1) -> SelfCheck:
    return SelfCheck(node=1, t=10.0, links=links, rdma=rdma, head=head, silent=silent or {}, peers=peers)


def test_own_side_gone_by_link_rdma_or_route() -> None:
    up = LinkState("eth0", True, "up", True)
    assert own_side_gone(_check((up,))) == ()
    no_carrier = LinkState("eth0", True, "down", False)
    assert own_side_gone(_check((up, no_carrier))) == ("interface eth0: operstate down, carrier 0",)
    assert own_side_gone(_check((LinkState("eth0", True, "up", False),)))  # up but no carrier: no link
    assert own_side_gone(_check((LinkState("ib-seat", False),))) == ("interface ib-seat: gone",)
    assert own_side_gone(_check((LinkState("lo", True, "unknown", True),))) == ()  # drivers that do not say
    # RDMA: every port down is a finding; one active port is a working fabric.
    down, active = RdmaPort("mlx5_0", 1, "1: DOWN"), RdmaPort("mlx5_1", 1, "4: ACTIVE")
    assert own_side_gone(_check((up,), (down,))) == ("RDMA mlx5_0 port 1: 1: DOWN",)
    assert own_side_gone(_check((up,), (down, active))) == ()
    # The route: the head (elsewhere) unreachable with every one of two or more peers silent.
    far = HeadReach("198.18.0.1:6379", reachable=False, error="TimeoutError: timed out")
    assert own_side_gone(_check((up,), head=far, silent={0: "x", 2: "y"}, peers=2))
    assert own_side_gone(_check((up,), head=far, silent={0: "x"}, peers=2)) == ()  # one peer of two still answers
    # One peer only: it may be the one that went (its host holds the head): not this node's finding.
    assert own_side_gone(_check((up,), head=far, silent={0: "x"}, peers=1)) == ()
    here = HeadReach("198.18.0.2:6379", reachable=False, local=True, error="refused")
    assert own_side_gone(_check((up,), head=here, silent={0: "x", 2: "y"}, peers=2)) == ()


def test_the_check_round_trips_as_json_and_a_bad_manifest_field_is_none() -> None:
    c = _check((LinkState("eth0", True, "down", None),), (RdmaPort("mlx5_0", 1, "1: DOWN"),),
               HeadReach("127.0.0.1:1", False, True, "refused"), {0: "heartbeat answered 3.1 s ago"}, 1)
    doc = json.loads(json.dumps(c.to_json()))
    assert doc["isolated"] is True
    assert SelfCheck.from_json(doc) == c
    assert checks_from_json({"1": doc}) == {1: c}
    assert checks_from_json("garbage") == {} and checks_from_json({"x": doc, "2": 5}) == {}


def test_reading_links_from_sysfs(tmp_path: Path) -> None:
    _link(tmp_path, "veth-a", "up", "1")
    _link(tmp_path, "veth-b", "lowerlayerdown", "0")
    _link(tmp_path, "veth-c", "down", None)
    got = selfcheck.read_links(["veth-a", "veth-b", "veth-c", "gone0"], tmp_path)
    assert [(x.name, x.up, x.operstate, x.carrier) for x in got] == [
        ("veth-a", True, "up", True), ("veth-b", False, "lowerlayerdown", False), ("veth-c", False, "down", None),
        ("gone0", False, None, None)]
    assert [x.name for x in selfcheck.links_down(["veth-a", "veth-b"], tmp_path)] == ["veth-b"]
    # This machine's own loopback, through the real sysfs.
    (lo,) = selfcheck.read_links(["lo"])
    assert lo.exists and lo.operstate is not None


def test_reading_rdma_ports(tmp_path: Path) -> None:
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        (tmp_path / dev / "ports" / "1").mkdir(parents=True)
        (tmp_path / dev / "ports" / "1" / "state").write_text(state + "\n")
    assert [(p.device, p.port, p.active) for p in selfcheck.read_rdma(tmp_path)] == [
        ("mlx5_0", 1, True), ("mlx5_1", 1, False)]
    assert selfcheck.read_rdma(tmp_path / "none") == ()


def test_the_seat_interfaces_come_from_the_plan_else_the_nodes_address() -> None:
    node = {"expect_interfaces": ["veth-a"], "env": {"GLOO_SOCKET_IFNAME": "veth-a,eth9", "NCCL_SOCKET_IFNAME": "^lo"}}
    assert selfcheck.seat_interfaces(node, None) == ["veth-a", "eth9"]  # an exclusion list names no interface
    assert selfcheck.seat_interfaces({"env": {}}, "127.0.0.1") == ["lo"]
    assert selfcheck.seat_interfaces(None, None) == []


def test_reaching_the_head() -> None:
    with held(listen=True) as port:
        ok = selfcheck.reach_head(f"127.0.0.1:{port}")
    assert ok.reachable and ok.local
    gone = selfcheck.reach_head(f"127.0.0.1:{port}")  # closed now: refused at once
    assert not gone.reachable and gone.error and "Refused" in gone.error


# ---- live: the sidecars on both sides of the cut


class _Peers:
    """Every other node silent from ``lost_at`` on; nobody is reachable for a capture."""

    def __init__(self, me: int, lost_at: float) -> None:
        self.me = me
        self.lost_at = lost_at
        self.collects = 0
        self.requests = 0

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        from sgl_seat.watchdog.peers import CoordinatorUnreachable

        raise CoordinatorUnreachable("no heartbeat answer for 3 s")

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.collects += 1
        other = 1 - self.me
        return [local()], [{"node": other, "step": "reach", "status": "unreachable",
                            "detail": "no heartbeat answer for 3 s", "last_seen": "heartbeat answered 3.0 s ago"}]

    def silent(self, now: float) -> dict[int, str]:
        return {1 - self.me: "heartbeat answered 3.0 s ago"} if now >= self.lost_at else {}

    def watch_gaps(self) -> dict[int, str]:
        return {}


def _sidecar(tmp_path: Path, node: int, peers: _Peers, clock: list[float], net: Path) -> Sidecar:
    cfg = SidecarConfig(seat="s", node=node, nnodes=2, thresholds={}, bundle_dir=str(tmp_path / f"bundles{node}"),
                        rank_nodes=RANK_NODES, gpu=False, metrics_port=0, interfaces=[f"veth{node}"])
    return Sidecar(cfg, peers=peers, sampler=Sampler(node=node, discover=lambda: [], pyspy=False),
                   clock=lambda: clock[0], net_root=net, ib_root=net / "no-ib")


def _wait_bundle(sc: Sidecar) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while not sc.bundles and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sc.bundles) == 1, sc.capture_errors
    return sc.bundles[0]


def _cut(tmp_path: Path, isolated: int) -> tuple[Path, Path]:
    """Node ``isolated``'s link goes down (carrier 0, as a veth whose bridge side is down); both sidecars tick
    through it. Returns (the healthy node's bundle, the isolated node's bundle)."""
    net = tmp_path / "net"
    _link(net, "veth0", "up", "1")
    _link(net, "veth1", "up", "1")
    clock = [100.0]
    peers = {n: _Peers(n, lost_at=103.0) for n in (0, 1)}
    sides = {n: _sidecar(tmp_path, n, peers[n], clock, net) for n in (0, 1)}
    try:
        for sc in sides.values():
            assert sc.tick() is None
        _link(net, f"veth{isolated}", "lowerlayerdown", "0")
        clock[0] = 100.5
        assert sides[isolated].tick() is None  # down, but for less than LINK_DOWN_S: a flap is not a finding yet
        clock[0] = 100.5 + LINK_DOWN_S
        v = sides[isolated].tick()
        # Its own link down for LINK_DOWN_S: it names itself before its peers even went silent.
        assert v is not None and (v.kind, v.node, v.node_ranks) == (
            VerdictKind.NODE_ISOLATED, isolated, tuple(r for r, n in RANK_NODES.items() if n == isolated))
        assert f"interface veth{isolated}: operstate lowerlayerdown, carrier 0" in v.evidence[0]
        healthy = 1 - isolated
        assert sides[healthy].tick() is None  # its peer still answered 2.5 s ago
        clock[0] = 103.0
        hv = sides[healthy].tick()
        assert hv is not None and (hv.kind, hv.node) == (VerdictKind.NODE_UNREACHABLE, isolated)
        assert f"node {healthy}'s own side (healthy): interface veth{healthy}: operstate up, carrier 1" in hv.evidence
        got = {n: Path(_wait_bundle(sc)["path"]) for n, sc in sides.items()}
        # The isolated node asked nobody: no coordinator request, no collection from its unreachable peers.
        assert peers[isolated].requests == 0 and peers[isolated].collects == 0
        return got[healthy], got[isolated]
    finally:
        for sc in sides.values():
            sc.exporter.close()


def _verdict(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((path / "manifest.json").read_text())["verdict"]
    return doc


def test_node1_link_down_both_sides_and_the_merge_name_node1(tmp_path: Path) -> None:
    healthy, isolated = _cut(tmp_path, isolated=1)
    v0, v1 = _verdict(healthy), _verdict(isolated)
    assert (v0["kind"], v0["node"], v0["node_ranks"]) == ("node-unreachable", 1, [2, 3])
    assert (v1["kind"], v1["node"], v1["node_ranks"]) == ("node-isolated", 1, [2, 3])
    assert any("interface veth1: operstate lowerlayerdown, carrier 0" in e for e in v1["evidence"])
    m1 = json.loads((isolated / "manifest.json").read_text())
    assert m1["nodes"] == [1] and m1["self_check"]["1"]["isolated"] is True
    assert [m["status"] for m in m1["capture"] if m.get("node") == 0] == ["not asked"]
    m0 = json.loads((healthy / "manifest.json").read_text())
    assert m0["self_check"]["0"]["isolated"] is False
    # replay of either bundle reaches its own verdict from its records and its self-check
    rv0, _ = rerun_detectors(read_bundle(healthy))
    rv1, _ = rerun_detectors(read_bundle(isolated))
    assert rv0 is not None and (rv0.kind, rv0.node) == (VerdictKind.NODE_UNREACHABLE, 1)
    assert rv1 is not None and (rv1.kind, rv1.node) == (VerdictKind.NODE_ISOLATED, 1)
    # bundle merge, either order: the side with the evidence names the node
    for i, order in enumerate(((healthy, isolated), (isolated, healthy))):
        merged = merge_bundles(list(order), tmp_path / f"merged{i}")
        mv = _verdict(merged)
        assert (mv["kind"], mv["node"]) == ("node-isolated", 1), mv
        assert json.loads((merged / "manifest.json").read_text())["nodes"] == [0, 1]
        again, _ = rerun_detectors(read_bundle(merged))
        assert again is not None and (again.kind, again.node) == (VerdictKind.NODE_ISOLATED, 1)


def test_node0_link_down_node0_names_itself_and_node1_names_node0(tmp_path: Path) -> None:
    healthy, isolated = _cut(tmp_path, isolated=0)
    assert (_verdict(healthy)["kind"], _verdict(healthy)["node"]) == ("node-unreachable", 0)
    assert (_verdict(isolated)["kind"], _verdict(isolated)["node"]) == ("node-isolated", 0)
    mv = _verdict(merge_bundles([isolated, healthy], tmp_path / "merged"))
    assert (mv["kind"], mv["node"]) == ("node-isolated", 0)


def test_a_healthy_side_with_no_known_interface_still_names_the_peer() -> None:
    check = SelfCheck(node=0, t=1.0, head=HeadReach("127.0.0.1:6379", True, True), silent={1: "x"}, peers=1)
    v = loss_verdict(RANK_NODES, [0], 1.0, checks={0: check})
    assert v is not None and (v.kind, v.node) == (VerdictKind.NODE_UNREACHABLE, 1)
    assert any("no seat interface known" in e for e in v.evidence)
    assert loss_verdict(RANK_NODES, [0, 1], 1.0, checks={0: check}) is None  # nobody lost, nobody isolated
