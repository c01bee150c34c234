"""Two seats on one host (issue 49): every port a seat binds is checked before anything starts, the refusal names
the spec key that moves it, ``--port-base`` moves a seat's ports without an edited copy, and a copied profile keeps
planning (its built-in model is found by name, not by a path relative to the profile).

Why these seams: the ports a seat binds on one host come from the plan and the engine backend (``local_port_failures``
reads them as the agents' preflight does); `up` runs that check before it starts a local cluster, so the unit test
drives `up` itself with the local cluster's start replaced by a failure: a refusal that reaches it came too late.
Ports: a free block of 30940-30999 (``SGLSEAT_TEST_PORTS`` moves it), held by the test where it needs one held.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.engines import backend_for
from sgl_seat.errors import PreflightError, SpecError
from sgl_seat.launch import up as seat_up
from sgl_seat.launch.bringup import local_port_failures
from sgl_seat.launch.host import localcluster
from sgl_seat.netports import free_block, held, port_range, random_starts
from sgl_seat.plan import build_plan
from sgl_seat.spec import builtin_seats_dir, load_spec, parse_spec

LO, HI = port_range((30940, 30999))
#: local-sim's ports from its HTTP port: node 0's listen, admin, dist-init; node 1's listen and admin; 2 exporters.
OFFSETS = (0, 2, 5, 10, 12, 15, 16)


@pytest.fixture(autouse=True)
def _mirror(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))


def _base() -> int:
    base = free_block(random_starts(LO, HI - max(OFFSETS)), OFFSETS)
    assert base is not None, f"no free block in {LO}-{HI}"
    return base


def test_a_copied_profile_plans_like_the_built_in(tmp_path: Path) -> None:
    """GIVEN local-sim copied out of launch/seats (its model.config is ../models/deepseek-v4-flash, relative to the
    profile) WHEN it is planned THEN it plans as the built-in does (it used to fail: "no config.json at
    .../../models/deepseek-v4-flash/config.json"); a bare built-in name plans too, and an unknown one still fails
    naming the built-in models."""
    copy = tmp_path / "elsewhere" / "my-seat.yaml"
    copy.parent.mkdir()
    shutil.copy(builtin_seats_dir() / "local-sim.yaml", copy)
    builtin = build_plan(load_spec("local-sim"))
    assert build_plan(load_spec(str(copy))).capacity == builtin.capacity
    text = copy.read_text()
    bare = parse_spec(text.replace("config: ../models/deepseek-v4-flash", "config: deepseek-v4-flash"),
                      path=str(copy))
    assert build_plan(bare).capacity == builtin.capacity
    bad = parse_spec(text.replace("config: ../models/deepseek-v4-flash", "config: ../models/nope"), path=str(copy))
    with pytest.raises(SpecError, match=r"no config\.json") as err:
        build_plan(bad)
    assert "deepseek-v4-flash" in str(err.value.fix)


def test_port_base_moves_every_port_and_keeps_their_distances() -> None:
    """GIVEN local-sim (HTTP 31000, dist-init 31005) WHEN moved with --port-base 31200 THEN the plan's HTTP port is
    31200 and dist-init 31205, node 0's argv says so, and every other port follows (a base that would push a port
    past 65535 is refused)."""
    spec = load_spec("local-sim")
    plan = build_plan(spec.with_port_base(31200))
    assert (plan.http_port, plan.dist_init_port) == (31200, 31205)
    argv = plan.nodes[0].command
    assert argv[argv.index("--port") + 1] == "31200" and argv[argv.index("--dist-init-addr") + 1].endswith(":31205")
    assert spec.with_port_base(None) is spec and spec.with_port_base(31000) is spec
    with pytest.raises(SpecError, match="--port-base 65530"):
        spec.with_port_base(65530)


@pytest.mark.parametrize(("offset", "node", "key"), [(5, 0, "network.dist_init_port"), (12, 1, "network.http_port"),
                                                     (16, 1, "network.http_port")])
def test_a_held_port_of_any_node_is_found_and_names_its_key(offset: int, node: int, key: str) -> None:
    """GIVEN local-sim moved to a free block and one of its ports held by another process (node 0's dist-init, node
    1's admin port, node 1's metrics exporter) WHEN its ports are checked THEN the failure names that node, the port
    and the spec key that moves it, and the fix offers a --port-base where every port of the seat is free now."""
    base = _base()
    plan = build_plan(load_spec("local-sim").with_port_base(base))
    backend = backend_for("sim")
    assert local_port_failures(plan, backend, exporter=True) is None
    with held(base + offset, listen=True):
        err = local_port_failures(plan, backend, exporter=True)
    assert err is not None and err.nodes == (node,)
    assert f"node {node}: ports-free:" in err.message and f"port {base + offset} is in use" in err.message
    assert key in err.message and "--port-base" in err.message
    assert err.fix is not None and "--port-base " in err.fix and "free there now" in err.fix


def test_ports_a_seat_would_share_between_its_own_nodes_are_refused() -> None:
    """GIVEN a seat whose dist-init port is node 1's listen port on the same host (http + 10) WHEN checked THEN the
    collision is named with the key to change, though nothing else holds the port."""
    base = _base()
    spec = load_spec("local-sim").with_port_base(base)
    spec = spec.model_copy(update={"network": spec.network.model_copy(update={"dist_init_port": base + 10})})
    err = local_port_failures(build_plan(spec), backend_for("sim"), exporter=False)
    assert err is not None and "also node 0's dist_init port" in err.message
    assert "network.dist_init_port" in err.message


def test_up_refuses_a_held_port_before_it_starts_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN local-sim on a free block with its dist-init port held WHEN `up` runs THEN it fails in its first stage,
    "ports", with the PreflightError naming network.dist_init_port, before any local cluster is started (that takes
    seconds and used to come first), and leaves no seat record."""
    base = _base()
    started: list[Any] = []
    monkeypatch.setattr(localcluster, "start_local_cluster", lambda *a, **k: started.append(a) or 1 / 0)
    seen: list[str] = []

    class Rep:
        def start(self, stage: str, detail: str) -> None:
            seen.append(stage)

        def finish(self, stage: str, seconds: float, detail: str, status: str = "ok") -> None:
            return None

    with held(base + 5, listen=True), pytest.raises(PreflightError, match=r"network\.dist_init_port"):
        seat_up.up(load_spec("local-sim"), seat_up.UpOptions(port_base=base), Rep())
    assert seen == ["ports"] and started == []
    from sgl_seat.launch.seatrecord.record import list_names

    assert list_names() == []
