"""A node that stops answering heartbeats is a finding by itself (issue 11): the sidecar captures at once, without
waiting for a hang detector (a link can go down with no traffic at all), and the bundle names the node, its ranks
and what was last seen from it.

The peers are a stand-in for :class:`~sgl_seat.watchdog.actors.RayPeers` (the heartbeats themselves run over
Ray: tests/integration/test_netns_cluster.py cuts a real link and kills a real raylet).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar

RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}
SEEN = "heartbeat answered 3.2 s ago (16:47:44.3 UTC); last stack sample 16:47:43.6 UTC; no probe record"


class _Peers:
    """Node 1 silent from ``lost_at`` on; a capture gets only this node's part and node 1 as missing."""

    def __init__(self, lost_at: float) -> None:
        self.lost_at = lost_at
        self.collects = 0

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("node 0 coordinates its own captures")

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        self.collects += 1
        return [local()], [{"node": 1, "step": "reach", "status": "unreachable",
                            "detail": "no heartbeat answer for 3 s", "last_seen": SEEN}]

    def silent(self, now: float) -> dict[int, str]:
        return {1: SEEN} if now >= self.lost_at else {}

    def watch_gaps(self) -> dict[int, str]:
        return {}


def _sidecar(tmp_path: Path, peers: _Peers, clock: list[float]) -> Sidecar:
    cfg = SidecarConfig(seat="s", node=0, nnodes=2, thresholds={}, bundle_dir=str(tmp_path), rank_nodes=RANK_NODES,
                        gpu=False)
    return Sidecar(cfg, peers=peers, sampler=Sampler(node=0, discover=lambda: [], pyspy=False),
                   clock=lambda: clock[0])


def test_a_silent_node_is_captured_at_once_and_named_with_what_was_last_seen(tmp_path: Path) -> None:
    clock = [100.0]
    peers = _Peers(lost_at=103.0)
    sc = _sidecar(tmp_path, peers, clock)
    try:
        assert sc.tick() is None and peers.collects == 0  # every node answering, nothing detected: no capture
        clock[0] = 103.0
        v = sc.tick()
        assert v is not None and (v.kind.value, v.node, v.node_ranks) == ("node-unreachable", 1, (2, 3))
        deadline = time.monotonic() + 20
        while not sc.bundles and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sc.bundles) == 1, sc.capture_errors
        clock[0] = 104.0
        sc.tick()  # still silent, but latched: one loss, one bundle
        time.sleep(0.2)
        assert peers.collects == 1
        manifest = json.loads((Path(sc.bundles[0]["path"]) / "manifest.json").read_text())
        verdict = manifest["verdict"]
        assert (verdict["kind"], verdict["node"], verdict["node_ranks"]) == ("node-unreachable", 1, [2, 3])
        assert f"node 1 last seen: {SEEN}" in verdict["evidence"]
        assert manifest["missing_nodes"][0]["ranks"] == [2, 3]
        assert all("last_seen" not in step for step in manifest["capture"])  # said once, in the verdict
    finally:
        sc.exporter.close()


def test_a_sidecar_whose_raylet_is_gone_captures_nothing(tmp_path: Path) -> None:
    """Its node's raylet killed: the node's engines die with it, but that is not this sidecar's finding to write
    (the other nodes name the node unreachable); before the raylet went, the same silence is captured."""
    clock = [103.0]
    gone = [True]
    peers = _Peers(lost_at=100.0)
    cfg = SidecarConfig(seat="s", node=0, nnodes=2, thresholds={}, bundle_dir=str(tmp_path), rank_nodes=RANK_NODES,
                        gpu=False)
    sc = Sidecar(cfg, peers=peers, sampler=Sampler(node=0, discover=lambda: [], pyspy=False),
                 clock=lambda: clock[0], host_gone=lambda: gone[0])
    try:
        assert sc.tick() is None and peers.collects == 0 and sc.latched_at is None
        gone[0] = False
        v = sc.tick()
        assert v is not None and v.kind.value == "node-unreachable"
        deadline = time.monotonic() + 20
        while peers.collects == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert peers.collects == 1
    finally:
        sc.exporter.close()


def test_the_sidecar_actor_starts_its_watchdog_once_and_calls_do_not_start_more(tmp_path: Path) -> None:
    """`ping` and `capture_part` check the raylet and answer; they once started the watchdog again on every call,
    and the tick threads piled up (two a ping, two pings a second from each peer) until the host was too loaded
    to answer heartbeats, and the seat wrote false node-unreachable bundles."""
    from sgl_seat.watchdog.actors import SidecarActor

    cfg = SidecarConfig(seat="s", node=0, nnodes=1, thresholds={}, bundle_dir=str(tmp_path), rank_nodes=RANK_NODES,
                        gpu=False, metrics_port=0, root_pid=os.getpid())
    actor = SidecarActor(cfg.to_json())
    try:
        first = actor.core._thread
        assert first is not None and first.is_alive()  # watching from construction on, as `up` expects
        before = {t.ident for t in threading.enumerate()}
        for _ in range(5):
            actor._alive_host()
            actor.core.start()
        assert actor.core._thread is first
        started = [t.name for t in threading.enumerate() if t.ident not in before]
        assert not [n for n in started if n.startswith(("sgl-seat-watchdog", "sgl-seat-liveness"))], started
    finally:
        actor.stop()
    assert not first.is_alive()
