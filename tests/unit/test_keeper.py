"""The keeper (issue 24, item 3): a process outside Ray that captures its node alone when the node's raylet dies,
and exits quietly when its sidecar stops or goes while the raylet lives. The raylet and the sidecar are stand-ins
(real processes this test starts and kills by pid); the keeper is the real one, started as the sidecar starts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil

from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.keeper import RESULT, Watched, keeper_dir, start_keeper, stop_keeper, stop_local_keepers

RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def _cfg(tmp_path: Path) -> SidecarConfig:
    return SidecarConfig(seat="s", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path / "bundles"),
                         rank_nodes=RANK_NODES, gpu=False, interfaces=["lo"], root_pid=None, engine_port=1)


def _stand_in() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"])


def _end(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def _gone(w: Watched, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while w.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not w.alive()


def test_the_raylet_gone_the_keeper_writes_this_nodes_bundle_and_exits(tmp_path: Path) -> None:
    raylet, sidecar = _stand_in(), _stand_in()
    keeper = start_keeper(_cfg(tmp_path), tmp_path / "k", raylet=Watched.of(raylet.pid),
                          sidecar=Watched.of(sidecar.pid))
    try:
        # Not this process's child (Ray kills a worker's children when the worker exits): init's, or a subreaper's.
        assert psutil.Process(keeper.pid).ppid() != os.getpid()
        assert keeper.alive() and not list((tmp_path / "bundles").glob("*/manifest.json"))
        time.sleep(1.0)
        assert keeper.alive()  # both alive: it waits
        raylet.kill()
        raylet.wait(timeout=10)
        assert _gone(keeper)
        res = json.loads((tmp_path / "k" / RESULT).read_text())
        manifest = json.loads((Path(res["path"]) / "manifest.json").read_text())
        v = manifest["verdict"]
        assert (v["kind"], v["node"], v["node_ranks"]) == ("node-isolated", 1, [2, 3])
        assert f"its Ray raylet (pid {raylet.pid}) is gone" in v["evidence"][0]
        assert manifest["nodes"] == [1] and manifest["self_check"]["1"]["isolated"] is True
        assert manifest["trigger"]["source"] == "keeper"
        assert [c["status"] for c in manifest["capture"] if c.get("node") == 0] == ["not asked"]
    finally:
        _end(raylet, sidecar)
        stop_keeper(keeper, tmp_path / "k")
    assert not keeper.alive()


def test_the_sidecar_gone_with_its_raylet_alive_or_stopped_the_keeper_leaves_quietly(tmp_path: Path) -> None:
    raylet, sidecar = _stand_in(), _stand_in()
    try:
        keeper = start_keeper(_cfg(tmp_path), tmp_path / "k1", raylet=Watched.of(raylet.pid),
                              sidecar=Watched.of(sidecar.pid))
        time.sleep(0.5)
        sidecar.kill()
        sidecar.wait(timeout=10)
        assert _gone(keeper, 30)
        assert not (tmp_path / "k1" / RESULT).exists()
        keeper2 = start_keeper(_cfg(tmp_path), tmp_path / "k2", raylet=Watched.of(raylet.pid),
                               sidecar=Watched.of(raylet.pid))
        time.sleep(0.5)
        t0 = time.monotonic()
        stop_keeper(keeper2, tmp_path / "k2")
        assert not keeper2.alive() and time.monotonic() - t0 < 5.0
        assert not (tmp_path / "k2").exists()  # its directory removed with it
        assert not list((tmp_path / "bundles").glob("*/manifest.json"))
    finally:
        _end(raylet, sidecar)


def test_down_local_stops_this_hosts_keepers_of_the_seat_only(tmp_path: Path) -> None:
    """`down --local` reaches a keeper whose sidecar is out of reach (its node cut off): by the pid its directory
    holds, never by name; another node's keeper is left alone."""
    raylet, sidecar = _stand_in(), _stand_in()
    cfg = SidecarConfig(seat="keeper-test-seat", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path / "b"),
                        rank_nodes=RANK_NODES, gpu=False)
    d = keeper_dir(cfg.seat, cfg.node, sidecar.pid)
    keeper = start_keeper(cfg, d, raylet=Watched.of(raylet.pid), sidecar=Watched.of(sidecar.pid))
    try:
        assert stop_local_keepers(cfg.seat, {0}) == [] and keeper.alive()
        assert stop_local_keepers("another-seat", {1}) == [] and keeper.alive()
        assert stop_local_keepers(cfg.seat, {1}) == [keeper.pid]
        assert not keeper.alive() and not d.exists()
        assert not list((tmp_path / "b").glob("*/manifest.json"))  # stopped, not a capture
    finally:
        _end(raylet, sidecar)
        stop_keeper(keeper, d)
