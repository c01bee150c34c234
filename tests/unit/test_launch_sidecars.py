"""`up` says whether the watchdog runs: ``launch.sidecars.start_sidecars`` reports ok only when every node's
sidecar answers ``ping``, whatever the watchdog module's own ``start_sidecars`` returned (it logs a sidecar
that did not start and returns normally), and the CLI prints such a stage as WARN, not ok.

Ray is replaced by fake modules (no cluster, no subprocess)."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.cli.main import main
from sgl_seat.errors import ClusterError
from sgl_seat.launch import sidecars, stages
from sgl_seat.launch import up as up_mod
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import start_sidecars
from sgl_seat.watchdog import actors as watchdog_sidecar
from sgl_seat.watchdog.config import SidecarContext, SidecarNode

CTX = SidecarContext(seat="s", namespace="ns", pg_name="pg", plan_json="{}", bundles_dir="/nowhere",
                     timeout=2.0,
                     nodes=(SidecarNode(0, "a0", "127.0.0.1"), SidecarNode(1, "a1", "127.0.0.1")))


class _Handle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ping = types.SimpleNamespace(remote=lambda: name)


def fake_ray(monkeypatch: pytest.MonkeyPatch, actors: set[str], *,
             get_placement_group: Callable[[str], Any] | None = None) -> None:
    """``ray.get_actor`` finds the names in ``actors``; ``get_placement_group`` as given (else it fails)."""

    def get_actor(name: str, namespace: str | None = None) -> _Handle:
        if name not in actors:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return _Handle(name)

    def no_group(name: str) -> Any:
        raise RuntimeError("the GCS refused get_placement_group")

    ray = types.ModuleType("ray")
    util = types.ModuleType("ray.util")
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    ray.get_actor = get_actor  # type: ignore[attr-defined]
    ray.util = util  # type: ignore[attr-defined]
    util.get_placement_group = get_placement_group or no_group  # type: ignore[attr-defined]
    strategies.PlacementGroupSchedulingStrategy = object  # type: ignore[attr-defined]
    for name, mod in (("ray", ray), ("ray.util", util), ("ray.util.scheduling_strategies", strategies)):
        monkeypatch.setitem(sys.modules, name, mod)
    # A ping answers unless the handle's name says otherwise.
    monkeypatch.setattr(sidecars, "get", lambda ref, timeout, what: _answer(ref, what))


def _answer(ref: str, what: str) -> str:
    if "watchdog1" in ref:
        raise ClusterError(f"{what} did not answer within 2 s")
    return json.dumps({"node": 0})


def test_the_watchdogs_own_start_swallows_a_failure_and_up_still_reports_it(monkeypatch: pytest.MonkeyPatch,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The real ``sgl_seat.watchdog.actors.create_sidecar_actors`` with a GCS that refuses: it returns None (logs only),
    and the launch side finds no sidecar answering."""
    fake_ray(monkeypatch, actors=set())
    assert watchdog_sidecar.create_sidecar_actors(CTX) is None
    assert "watchdog sidecars not started" in caplog.text
    got = start_sidecars(CTX)
    assert not got.ok
    assert "node 0: no sidecar actor sgl-seat-s-watchdog0" in got.detail and "node 1:" in got.detail


def test_a_sidecar_that_does_not_answer_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ray(monkeypatch, actors={"sgl-seat-s-watchdog0", "sgl-seat-s-watchdog1"})
    monkeypatch.setattr(watchdog_sidecar, "create_sidecar_actors", lambda ctx: None)
    got = start_sidecars(CTX)
    assert not got.ok and "node 1: sidecar sgl-seat-s-watchdog1 did not answer" in got.detail
    assert "node 0" not in got.detail


def test_every_sidecar_answering_is_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ray(monkeypatch, actors={"sgl-seat-s-watchdog0", "sgl-seat-s-watchdog1"})
    monkeypatch.setattr(watchdog_sidecar, "create_sidecar_actors", lambda ctx: None)
    monkeypatch.setattr(sidecars, "get", lambda ref, timeout, what: "{}")
    got = start_sidecars(CTX)
    assert got.ok and got.detail == "running on nodes 0, 1"


def test_a_start_that_raises_or_hangs_is_not_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_ray(monkeypatch, actors=set())

    def boom(ctx: SidecarContext) -> None:
        raise RuntimeError("py-spy missing")

    monkeypatch.setattr(watchdog_sidecar, "create_sidecar_actors", boom)
    got = start_sidecars(CTX)
    assert not got.ok and got.detail == "not started: RuntimeError: py-spy missing"
    release = threading.Event()
    monkeypatch.setattr(watchdog_sidecar, "create_sidecar_actors", lambda ctx: release.wait())
    monkeypatch.setattr(sidecars, "START_GRACE_S", 0.2)
    try:
        got = start_sidecars(dataclasses.replace(CTX, timeout=0.1))
    finally:
        release.set()
    assert not got.ok and "did not answer sgl_seat.watchdog.actors.create_sidecar_actors within 0 s" in got.detail


def test_up_prints_a_sidecar_failure_as_warn(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    """The CLI's stage line for a failed watchdog start says WARN (the seat is READY, but not watched)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    fake_ray(monkeypatch, actors=set())
    monkeypatch.setattr(watchdog_sidecar, "create_sidecar_actors", lambda ctx: None)

    def fake_up(spec: Any, opts: up_mod.UpOptions, reporter: stages.Reporter) -> tuple[SeatRecord, stages.StageTimes]:
        rec = SeatRecord(name="s", state=SeatState.READY, engine="sim", draft=False, cluster_address="local",
                         namespace="ns", pg_name="pg", endpoint="http://127.0.0.1:1", plan={},
                         nodes=[NodeRecord(node_rank=0, agent="a0"), NodeRecord(node_rank=1, agent="a1")])
        st = stages.Stages(reporter)
        with st.stage("ready"):
            pass
        up_mod._sidecars_stage(rec, st)  # what `up` runs once the seat is READY
        return rec, st.times

    monkeypatch.setattr(up_mod, "up", fake_up)
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "up"])
    with pytest.raises(SystemExit) as ei:
        main()
    assert ei.value.code == 0
    out = capsys.readouterr().out
    lines = {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if ln.split()[:1] in (["ok"], ["WARN"])}
    assert lines == {"ready": "ok", "sidecars": "WARN"}, out
