"""The seat's placement group: one bundle per node, STRICT_SPREAD, detached and named.

Ray prints nothing for a group it cannot place when no autoscaler runs; it just waits. So the wait
here has a deadline, and on expiry the error shows the cluster's available and total resources
beside the request, and the group is removed (``remove_placement_group`` is asynchronous, so the
removal is waited for too). The group is detached and named so that `down`, run from another
process, finds it in the seat's namespace.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.errors import ClusterError
from sgl_seat.launch.cluster import format_resources, resources
from sgl_seat.plan import LaunchPlan


def find_group(name: str) -> Any | None:
    """The placement group called ``name`` in the current namespace, or None (even if REMOVED)."""
    from ray.util import get_placement_group

    try:
        pg = bounded(f"get_placement_group({name!r})", get_placement_group, name)
    except ValueError:
        return None
    return None if group_state(pg) == "REMOVED" else pg


def group_state(pg: Any) -> str:
    from ray.util import placement_group_table

    return str(bounded("placement_group_table()", placement_group_table, pg).get("state", "UNKNOWN"))


def create_group(plan: LaunchPlan, name: str, timeout: float, *, budget: float | None = None) -> Any:
    """Create the group and wait until every bundle is placed, or fail within ``timeout``.

    ``budget`` is the operator's whole ``--timeout`` (of which ``timeout`` is what is left), for the message.
    """
    from ray.util import placement_group

    bundles = plan.placement.bundle_dicts()
    pg = bounded(f"placement_group({name!r})", placement_group, bundles, strategy=plan.placement.strategy, name=name,
                 lifetime="detached")
    t0 = time.monotonic()
    deadline = t0 + timeout
    try:
        # Short slices keep Ctrl-C responsive while Ray blocks in C++.
        while not pg.wait(timeout_seconds=1):
            if time.monotonic() >= deadline:
                avail, total = resources()
                want = ", ".join(format_resources(b) for b in bundles)
                raise ClusterError(
                    f"the placement group ({plan.placement.strategy}, {len(bundles)} bundles: {want}) could not be"
                    f" placed within the {budget or timeout:.0f} s timeout (waited {time.monotonic() - t0:.1f} s)"
                    f"\n  cluster available: {format_resources(avail)}"
                    f"\n  cluster total:     {format_resources(total)}\n  (the group was removed)",
                    fix=f"{plan.placement.strategy} needs {len(bundles)} distinct nodes with those resources each;"
                        " add nodes, or shrink cluster.nodes / gpus_per_node / cpus_per_node",
                )
    except BaseException:
        with contextlib.suppress(ClusterError):  # the error being raised says more than a failed removal
            remove_group(pg)
        raise
    return pg


def remove_group(pg: Any, timeout: float = 15.0) -> bool:
    """Remove ``pg`` and wait until Ray reports it REMOVED; False if it did not within ``timeout``."""
    from ray.util import remove_placement_group

    bounded("remove_placement_group()", remove_placement_group, pg, timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if group_state(pg) == "REMOVED":
            return True
        time.sleep(0.1)
    return False


def bundle_nodes(pg: Any) -> dict[int, str]:
    """Bundle index -> Ray node id (keyed on node id: simulated nodes all share 127.0.0.1)."""
    from ray.util import placement_group_table

    table = bounded("placement_group_table()", placement_group_table, pg)
    return {int(k): str(v) for k, v in table.get("bundles_to_node_id", {}).items()}
