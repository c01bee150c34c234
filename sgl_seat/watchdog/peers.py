"""How a sidecar reaches the others: the :class:`Peers` protocol and in-process peers.

In a seat the peers are the other sidecars' Ray actors (:class:`sgl_seat.watchdog.actors.RayPeers`); in
tests and single-host tools, :func:`local_peers` wires sidecar cores to each other in-process (node 0
coordinates, everyone reaches everyone). It knows a core only as :class:`SidecarCore`, the two calls it makes
(:class:`~sgl_seat.watchdog.sidecar.Sidecar` is one); this module never imports the sidecar, which imports it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sgl_seat.watchdog.capture import wire


class CoordinatorUnreachable(RuntimeError):
    """Node 0's sidecar does not answer a ping: the requester coordinates the capture itself."""


class Peers(Protocol):
    """How a sidecar reaches the others (Ray in production, direct calls in tests)."""

    def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
        """Ask the coordinator for a capture; returns its answer (status, bundle path...)."""
        ...

    def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every node's part of capture ``capture_id`` (local computed in-process) and missing-node notes."""
        ...

    def collect_native(self, capture_id: str, nodes: list[int], local: Callable[[], dict[str, Any]]
                       ) -> list[dict[str, Any]]:
        """The late parts (native stacks, nvidia-smi) of capture ``capture_id`` from ``nodes`` (those whose part
        is in its bundle); a node that does not answer in time is left out (its Python stacks stay)."""
        ...

    def silent(self, now: float) -> dict[int, str]:
        """Nodes lost since they were last heard from (heartbeats), each with what was last seen from it; called
        every tick, never blocks."""
        ...

    def watch_gaps(self) -> dict[int, str]:
        """Peers whose sidecar is silent while their node answers (only their watchdog is gone), from the last
        :meth:`silent`, each with why it is taken for reachable."""
        ...


class SidecarCore(Protocol):
    """What :func:`local_peers` calls on a node's sidecar core (:class:`~sgl_seat.watchdog.sidecar.Sidecar`)."""

    def coordinate(self, trigger: dict[str, Any]) -> dict[str, Any]:
        """As node 0: run the capture that ``trigger`` asks for; returns its answer (status, bundle path...)."""
        ...

    def part(self, capture_id: str, t: float) -> dict[str, Any]:
        """This node's part of capture ``capture_id`` at time ``t`` (JSON-able)."""
        ...

    def native_part(self, capture_id: str) -> dict[str, Any]:
        """This node's late part of capture ``capture_id`` (JSON-able)."""
        ...


def local_peers(sidecars: Mapping[int, SidecarCore]) -> dict[int, Peers]:
    """In-process peers for tests and single-host tools: node 0 coordinates, everyone reaches everyone."""

    class _Local:
        def __init__(self, me: int) -> None:
            self.me = me

        def request_capture(self, trigger: dict[str, Any]) -> dict[str, Any]:
            coord = sidecars.get(0) or sidecars[self.me]
            return coord.coordinate(trigger)

        def collect(self, capture_id: str, t: float, local: Callable[[], dict[str, Any]]
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            # Every node's part at once, as the Ray peers take them (each is seconds of stack dumps under load).
            others = [sc for n, sc in sorted(sidecars.items()) if n != self.me]
            with concurrent.futures.ThreadPoolExecutor(max_workers=1 + len(others)) as pool:
                mine = pool.submit(local)
                theirs = [pool.submit(sc.part, capture_id, t) for sc in others]
                # Across a process boundary a part is plain JSON: its in-process record objects ("_" keys) stay home.
                return [mine.result()] + [json.loads(json.dumps(wire(f.result()))) for f in theirs], []

        def collect_native(self, capture_id: str, nodes: list[int], local: Callable[[], dict[str, Any]]
                           ) -> list[dict[str, Any]]:
            others = [sc for n, sc in sorted(sidecars.items()) if n != self.me and n in nodes]
            with concurrent.futures.ThreadPoolExecutor(max_workers=1 + len(others)) as pool:
                mine = pool.submit(local)
                theirs = [pool.submit(sc.native_part, capture_id) for sc in others]
                return [mine.result()] + [json.loads(json.dumps(f.result())) for f in theirs]

        def silent(self, now: float) -> dict[int, str]:
            return {}  # in one process every peer is reached directly

        def watch_gaps(self) -> dict[int, str]:
            return {}

    return {n: _Local(n) for n in sidecars}
