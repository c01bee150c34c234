"""RayPeers.collect when a node answers the ping and is then lost during its part of the capture (host b's
raylet killed under traffic, tests/integration/test_netns_cluster.py): the node is missing from the capture
*with* what was last seen from it, as it is when it was silent before the capture began.

A stand-in for the ``ray`` module at the one seam ``collect`` uses (``ray.get`` on object refs, ``ray.nodes``);
the real Ray path runs in the netns integration test.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import pytest

from sgl_seat.watchdog.actors import RayPeers
from sgl_seat.watchdog.config import SidecarConfig


class _Ref:
    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self.value, self.error = value, error


class _Method:
    def __init__(self, ref: _Ref) -> None:
        self.ref = ref

    def remote(self, *args: Any) -> _Ref:
        return self.ref


class _Actor:
    """Node 1's sidecar: answers the ping, then its capture fails the way a killed raylet's actor does."""

    def __init__(self) -> None:
        self.ping = _Method(_Ref("{}"))
        self.capture_part = _Method(_Ref(error=RuntimeError("ActorUnavailableError: the actor is unavailable")))


def _get(ref: _Ref, timeout: float | None = None) -> Any:
    if ref.error is not None:
        raise ref.error
    return ref.value


def test_a_node_lost_during_its_capture_part_is_missing_with_its_last_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("ray")
    fake.get = _get  # type: ignore[attr-defined]
    fake.nodes = lambda: [{"NodeID": "abcdef0123", "Alive": False, "DeathReasonMessage": "raylet died"}]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake)
    cfg = SidecarConfig(seat="s", node=0, nnodes=2, thresholds={}, bundle_dir="/nonexistent",
                        rank_nodes={0: 0, 1: 0, 2: 1, 3: 1}, gpu=False)
    peers = RayPeers(cfg)
    peers._handles[1] = _Actor()
    now = time.time()
    peers._answer[1] = (now - 0.4, {"ip": "198.18.0.2", "node_id": "abcdef0123", "last_sample_t": now - 0.9,
                                    "last_probe": {"rank": 2, "target": "fetch_rows", "seq": 7, "start": now - 1.0,
                                                   "end": now - 0.99}})
    parts, missing = peers.collect("cap-1", now, lambda: {"node": 0})
    assert parts == [{"node": 0}]
    (m,) = missing
    assert (m["node"], m["step"], m["status"]) == (1, "capture", "error")
    assert "ActorUnavailableError" in m["detail"]
    seen = m["last_seen"]
    for part in ("heartbeat answered", "address 198.18.0.2", "last stack sample", "last probe record rank 2",
                 "Ray: node abcdef01 dead (raylet died)"):
        assert part in seen, seen
