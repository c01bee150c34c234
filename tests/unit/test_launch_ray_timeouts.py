"""A wedged GCS cannot hang `up`, `down` or `status`: every Ray call without a timeout of its own runs under
``cluster.bounded``'s deadline and becomes a ClusterError naming the call. Ray itself is replaced by fake
modules whose calls block until the test ends (no cluster, no subprocess)."""

from __future__ import annotations

import ast
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sgl_seat import deadline
from sgl_seat.errors import ClusterError
from sgl_seat.launch import agentclient, cluster, placement, status, teardown
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState

LAUNCH = Path(cluster.__file__).parent
# Ray functions that wait on the GCS with no timeout parameter (``ray.get`` has one and goes through cluster.get).
UNBOUNDED = {"get_actor", "get_placement_group", "placement_group_table", "available_resources",
             "cluster_resources", "placement_group", "remove_placement_group", "kill"}


@pytest.fixture
def wedged(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Fake ``ray`` and ``ray.util`` whose GCS calls block until the test is over; a 0.3 s deadline."""
    release = threading.Event()

    def block(*args: Any, **kwargs: Any) -> Any:
        release.wait()
        raise RuntimeError("released")

    ray = types.ModuleType("ray")
    util = types.ModuleType("ray.util")
    for name in UNBOUNDED:
        setattr(ray, name, block)
        setattr(util, name, block)
    ray.util = util  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    monkeypatch.setattr(deadline, "RAY_CALL_TIMEOUT", 0.3)
    yield release
    release.set()


def test_bounded_hands_back_results_and_errors_and_names_a_call_that_hangs() -> None:
    assert deadline.bounded("f()", lambda a, b=0: a + b, 1, b=2) == 3

    def missing() -> None:
        raise ValueError("Failed to look up actor")

    with pytest.raises(ValueError, match="look up actor"):
        deadline.bounded("ray.get_actor('x')", missing)
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"Ray did not answer ray.get_actor\('x'\) within 0 s"):
        deadline.bounded("ray.get_actor('x')", release.wait, timeout=0.2)
    assert time.monotonic() - t0 < 2.0
    release.set()


def test_placement_and_agent_lookups_give_up(wedged: threading.Event) -> None:
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"get_placement_group\('sgl-seat-s-pg'\)"):
        placement.find_group("sgl-seat-s-pg")
    with pytest.raises(ClusterError, match="placement_group_table"):
        placement.bundle_nodes(object())
    with pytest.raises(ClusterError, match=r"ray.get_actor\('sgl-seat-s-node0'\)"):
        agentclient.get_agent("s", 0)
    with pytest.raises(ClusterError, match="available_resources"):
        cluster.resources()
    assert time.monotonic() - t0 < 10.0


def test_status_with_a_wedged_gcs_fails_the_seat_instead_of_hanging(wedged: threading.Event) -> None:
    rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="10.0.0.1:6379",
                     namespace="n", pg_name="p", nodes=[NodeRecord(node_rank=0, agent="a0")])
    t0 = time.monotonic()
    status._reconcile(rec, timeout=5.0)
    assert time.monotonic() - t0 < 5.0
    assert rec.state is SeatState.FAILED and rec.reason is not None and "ray.get_actor" in rec.reason


def test_teardown_with_a_wedged_gcs_goes_on_and_says_what_it_could_not_check(wedged: threading.Event,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teardown, "stop_sidecars", lambda ctx, **kw: None)
    monkeypatch.setattr(cluster, "disconnect", lambda: None)
    rec = SeatRecord(name="s", state=SeatState.STOPPING, engine="sim", draft=False, cluster_address="10.0.0.1:6379",
                     namespace="n", pg_name="p", plan={}, nodes=[NodeRecord(node_rank=0, agent="a0")])
    t0 = time.monotonic()
    survivors = teardown.teardown(rec, connected=True)
    assert time.monotonic() - t0 < 5.0
    assert len(survivors) == 1 and "could not be removed or checked" in survivors[0] and "get_actor" in survivors[0]


def _direct_calls(path: Path) -> list[str]:
    """``f(...)`` (as ``from ray.util import f`` binds it) or ``ray.f(...)`` with ``f`` in UNBOUNDED: a Ray
    call made directly instead of being handed to ``cluster.bounded``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = (f.id if isinstance(f, ast.Name) else
                    f.attr if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "ray"
                    else None)
            if name in UNBOUNDED:
                out.append(f"{path.name}:{node.lineno}: {name}(...)")
    return out


def test_no_launch_module_calls_ray_without_a_deadline() -> None:
    files = sorted(LAUNCH.glob("*.py"))
    assert len(files) > 10
    assert [v for f in files for v in _direct_calls(f)] == []
