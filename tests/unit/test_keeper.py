"""The keeper (issue 24, item 3): a process outside Ray that, when the node's raylet dies, watches in the sidecar's
place (sampling, its exporter on the sidecar's port) and captures its node alone, and exits quietly when its sidecar
stops or goes while the raylet lives. The raylet, the sidecar and the engine are stand-ins (real processes this test
starts and kills by pid; the engine's command line is one the watchdog's discovery finds); the keeper is the real
one, started as the sidecar starts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from sgl_seat.core.records import StackSample, ThreadStack
from sgl_seat.errors import FormatVersionError
from sgl_seat.forensics.format.bundle import read_bundle
from sgl_seat.netports import any_free_port
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.keeper import (
    CONFIG,
    KEEPER_SCHEMA_VERSION,
    RESULT,
    Watched,
    keeper_dir,
    main,
    read_config,
    start_keeper,
    stop_keeper,
    stop_local_keepers,
)
from sgl_seat.watchdog.spool import HEADER, SampleSpool

RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def _cfg(tmp_path: Path, *, engine_port: int = 1, metrics_port: int | None = None) -> SidecarConfig:
    return SidecarConfig(seat="s", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path / "bundles"),
                         rank_nodes=RANK_NODES, gpu=False, interfaces=["lo"], root_pid=None, engine_port=engine_port,
                         metrics_port=metrics_port)


#: The stand-in engine's main process: a scheduler child (by its title, as SGLang names it), then a sleep.
ENGINE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import setproctitle, time; "
          "setproctitle.setproctitle(\"sglang::scheduler_TP2\"); time.sleep(300)']); time.sleep(300)")


def _engine(port: int) -> subprocess.Popen[bytes]:
    """A stand-in engine in a process group of its own: a main process whose command line the watchdog's discovery
    takes for node 1's engine, and its scheduler (sampled every round)."""
    return subprocess.Popen([sys.executable, "-c", ENGINE, "-m", "sgl_seat.sim.launch_server", "--node-rank", "1",
                             "--port", str(port)], start_new_session=True)


def _end_group(p: subprocess.Popen[bytes]) -> list[int]:
    """Kill the stand-in engine's group; return what of it is still alive (none)."""
    members = [p.pid, *(c.pid for c in psutil.Process(p.pid).children(recursive=True))] if p.poll() is None else []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    _, alive = psutil.wait_procs([psutil.Process(m) for m in members if psutil.pid_exists(m)], timeout=10)
    return [a.pid for a in alive]


def _spooled(t: float) -> StackSample:
    th = ThreadStack.from_json({"name": "MainThread", "thread_id": 1, "frames": [
        {"name": "event_loop_normal", "filename": "scheduler.py", "line": 1}]})
    return StackSample(t=t, node=1, pid=4242, title="sglang::scheduler_TP2", rank=2, native=False, threads=(th,))


def _metric(port: int, name: str) -> float | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    text = opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^{name}\{{node="1"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _stand_in() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"])


def _end(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def _raylet_killed(raylet: subprocess.Popen[bytes], directory: Path) -> dict[str, Any]:
    """Kill the stand-in raylet; the keeper's result.json once it captured."""
    raylet.kill()
    raylet.wait(timeout=10)
    deadline = time.monotonic() + 60
    while not (directory / RESULT).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    res: dict[str, Any] = json.loads((directory / RESULT).read_text())
    return res


def _gone(w: Watched, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while w.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not w.alive()


def test_the_raylet_gone_the_keeper_watches_in_the_sidecars_place_and_writes_this_nodes_bundle(
        tmp_path: Path) -> None:
    raylet, sidecar = _stand_in(), _stand_in()
    eport, mport = any_free_port(), any_free_port()
    engine = _engine(eport)
    keeper = start_keeper(_cfg(tmp_path, engine_port=eport, metrics_port=mport), tmp_path / "k",
                          raylet=Watched.of(raylet.pid), sidecar=Watched.of(sidecar.pid))
    try:
        # Not this process's child (Ray kills a worker's children when the worker exits): init's, or a subreaper's.
        assert psutil.Process(keeper.pid).ppid() != os.getpid()
        assert keeper.alive() and not list((tmp_path / "bundles").glob("*/manifest.json"))
        time.sleep(1.0)
        assert keeper.alive()  # both alive: it waits
        # What the sidecar spooled while it lived (it appends each sample to its keeper's directory as it takes it).
        spooled = [_spooled(time.time() - 5.0 + i) for i in range(3)]
        spool = SampleSpool(tmp_path / "k")
        for x in spooled:
            spool.append(x)
        res = _raylet_killed(raylet, tmp_path / "k")
        assert res["schema_version"] == KEEPER_SCHEMA_VERSION
        manifest = json.loads((Path(res["path"]) / "manifest.json").read_text())
        v = manifest["verdict"]
        assert (v["kind"], v["node"], v["node_ranks"]) == ("node-isolated", 1, [2, 3])
        assert f"its Ray raylet (pid {raylet.pid}) is gone" in v["evidence"][0]
        assert manifest["nodes"] == [1] and manifest["self_check"]["1"]["isolated"] is True
        assert manifest["trigger"]["source"] == "keeper"
        assert [c["status"] for c in manifest["capture"] if c.get("node") == 0] == ["not asked"]
        # Its history begins with the sidecar's spooled samples, not at the takeover.
        stacks = read_bundle(Path(res["path"])).stacks
        assert [x for x in stacks if x.t in {y.t for y in spooled}] == spooled, [x.t for x in stacks]
        # It watches on, in the sidecar's place: its exporter on the sidecar's port says so, and samples grow.
        assert keeper.alive()
        assert _metric(mport, "sgl_seat_watchdog_keeper_watching") == 1.0
        first = _metric(mport, "sgl_seat_watchdog_samples_total")
        time.sleep(2.5)
        later = _metric(mport, "sgl_seat_watchdog_samples_total")
        assert first is not None and later is not None and later > first, (first, later)
        # Its node's engine gone (taken down by pid, or dead): it stops watching and leaves nothing behind.
        assert _end_group(engine) == []
        assert _gone(keeper, 30)
        assert not [p.name for p in (tmp_path / "k").iterdir() if p.suffix == ".jsonl" or p.name == "keeper.json"]
    finally:
        _end(raylet, sidecar)
        _end_group(engine)
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
        assert not (tmp_path / "k1").exists()  # no capture, and its spool and config removed
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


# -- the keeper's files carry schema_version (KEEPER_SCHEMA_VERSION) ---------------------------------------------------

def _config(d: Path, **version: object) -> None:
    d.mkdir(parents=True, exist_ok=True)
    cfg = SidecarConfig(seat="keeper-version-seat", node=1, nnodes=2, thresholds={}, bundle_dir=str(d / "b"))
    (d / CONFIG).write_text(json.dumps({**version, "config": json.loads(cfg.to_json()),
                                        "raylet": {"pid": 1, "create_time": 0.0},
                                        "sidecar": {"pid": 1, "create_time": 0.0}}))


def test_start_keeper_writes_the_configs_version(tmp_path: Path) -> None:
    raylet, sidecar = _stand_in(), _stand_in()
    keeper = start_keeper(_cfg(tmp_path), tmp_path / "k", raylet=Watched.of(raylet.pid),
                          sidecar=Watched.of(sidecar.pid))
    try:
        assert KEEPER_SCHEMA_VERSION == 1
        assert json.loads((tmp_path / "k" / CONFIG).read_text())["schema_version"] == KEEPER_SCHEMA_VERSION
    finally:
        stop_keeper(keeper, tmp_path / "k")
        _end(raylet, sidecar)


def test_a_config_of_this_version_or_of_the_release_before_is_read(tmp_path: Path) -> None:
    _config(tmp_path / "now", schema_version=1)
    _config(tmp_path / "before")  # no schema_version: version 1
    assert read_config(tmp_path / "now")["config"]["seat"] == "keeper-version-seat"
    assert read_config(tmp_path / "before")["config"]["seat"] == "keeper-version-seat"


@pytest.mark.parametrize("version", [2, "1", True])
def test_a_config_of_another_version_is_refused_in_words(tmp_path: Path, version: object) -> None:
    _config(tmp_path, schema_version=version)
    with pytest.raises(FormatVersionError) as err:
        read_config(tmp_path)
    text = str(err.value)
    assert f"{tmp_path / CONFIG}: schema_version {version!r} is not one this sgl-seat reads (it reads 1;" in text
    assert "fix: " in text and "one version" in text


def test_a_keeper_given_a_config_of_another_version_says_so_and_exits(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    _config(tmp_path, schema_version=2)
    assert main([str(tmp_path)]) == 2
    assert f"{tmp_path / CONFIG}: schema_version 2 is not one this sgl-seat reads" in caplog.text


def test_down_local_leaves_a_keeper_whose_config_it_cannot_read_and_says_so(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Never a signal on the word of a file of another version: the stand-in (its command line names its
    directory, as a keeper's does) is left alone, and the warning names the file."""
    d = keeper_dir("keeper-version-seat", 1, os.getpid())
    _config(d, schema_version=2)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(d)])
    try:
        (d / "pid").write_text(str(stand_in.pid))
        assert stop_local_keepers("keeper-version-seat", {1}) == []
        assert stand_in.poll() is None
        assert f"{d / CONFIG}: schema_version 2 is not one this sgl-seat reads" in caplog.text
    finally:
        _end(stand_in)
        stop_keeper(None, d)


def test_a_spool_of_another_version_is_not_the_keepers_history_but_it_still_captures(tmp_path: Path) -> None:
    raylet, sidecar = _stand_in(), _stand_in()
    keeper = start_keeper(_cfg(tmp_path, metrics_port=any_free_port()), tmp_path / "k", raylet=Watched.of(raylet.pid),
                          sidecar=Watched.of(sidecar.pid))
    try:
        SampleSpool(tmp_path / "k").append(_spooled(time.time() - 1.0))
        (tmp_path / "k" / HEADER).write_text(json.dumps({"schema_version": 2}))
        res = _raylet_killed(raylet, tmp_path / "k")
        assert res["path"] and res["error"] is None, res
        assert 4242 not in {x.pid for x in read_bundle(Path(res["path"])).stacks}  # the spooled sample's pid
        assert _gone(keeper, 30)  # no engine of its node: it stops watching
        log_text = (tmp_path / "k" / "keeper.log").read_text()
        assert "the sidecar's samples are not read" in log_text
        assert f"{tmp_path / 'k' / HEADER}: schema_version 2 is not one this sgl-seat reads" in log_text
        assert not (tmp_path / "k" / HEADER).exists()  # removed with the spool
    finally:
        _end(raylet, sidecar)
        stop_keeper(keeper, tmp_path / "k")
