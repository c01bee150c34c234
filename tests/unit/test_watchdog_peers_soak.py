"""In-process peers take every node's capture part at once, as the Ray peers do.

Why: the soak (``bench/watchdog_soak.py``) measures stall -> bundle on the in-process rig; taken one node after the
other, each node's seconds of stack dumps added up and the rig reported a latency the seat (Ray actors, parts in
parallel) does not have.
"""

from __future__ import annotations

import threading
from typing import Any

from sgl_seat.watchdog.peers import local_peers


class _FakeSidecar:
    """Only what local_peers touches: ``part``. Each part waits for the other node's part to start."""

    def __init__(self, node: int, barrier: threading.Barrier) -> None:
        self.node = node
        self.barrier = barrier

    def part(self, capture_id: str, t: float) -> dict[str, Any]:
        self.barrier.wait()  # BrokenBarrierError after the timeout if the parts run one after the other
        return {"node": self.node, "capture_id": capture_id, "t": t}


def test_collect_takes_the_parts_concurrently() -> None:
    """GIVEN two nodes whose parts each wait for the other WHEN node 0 collects THEN both parts come back."""
    barrier = threading.Barrier(2, timeout=10)
    scs = {0: _FakeSidecar(0, barrier), 1: _FakeSidecar(1, barrier)}
    peers = local_peers(scs)  # type: ignore[arg-type]
    parts, missing = peers[0].collect("c1", 5.0, lambda: scs[0].part("c1", 5.0))
    assert [p["node"] for p in parts] == [0, 1]
    assert missing == []
    assert all(p["capture_id"] == "c1" for p in parts)
