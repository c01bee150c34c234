"""Everything but the local-cluster path, on one shared two-node local cluster (Ray startup is the slow part):
faults (a killed node-1 engine, 3 nodes on 2, SIGINT during `up`, a busy port, a second `up`), a rank-0 hang
that makes the seat DEGRADED and `logs -f`. (`demo` is test_demo.py's: the demo on its own local cluster, which
covers the seat's side; taking a seat down on a cluster it did not start, leaving the cluster, is every test here.)

The seats here use ``cluster.address: 127.0.0.1:<gcs port>`` of that cluster, i.e. the "existing
cluster" path; that is also how a 3-node seat is asked of a 2-node cluster. After each test no
process of the engines' groups may remain under the cluster, no placement group of the seat may be
left, and no node agent of the seat may be alive.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from launchutil import (
    CLI_S,
    Proc,
    alive,
    cli_argv,
    cli_env,
    descendants,
    endpoint_of,
    engine_pgids,
    in_groups,
    live_groups,
    ray_inspect,
    run_cli,
    seat_processes,
    status_json,
    wait_until,
    write_spec,
)

from sgl_seat.launch.host.localcluster import start_local_cluster, stop_local_cluster
from sgl_seat.netports import held

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Shared:
    address: str
    holder: int
    holder_pgid: int


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """A 2-node simulated cluster (2 fake GPUs each) held by our background process for this module."""
    home = tmp_path_factory.mktemp("shared-cluster")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    rec = start_local_cluster("launch-tests", nodes=2, gpus_per_node=2, cpus_per_node=3, timeout=180,
                              record=home / "cluster.json")
    assert rec.gcs_address
    try:
        yield Shared(rec.gcs_address, rec.pid, os.getpgid(rec.pid))
    finally:
        survivors = stop_local_cluster(pid=rec.pid, create_time=rec.create_time, known=rec.processes)
        assert survivors == []


@pytest.fixture
def clean(shared: Shared) -> Iterator[None]:
    """After the test: nothing under the cluster outside Ray's own process group, and no engine or engine host of
    a seat (they run outside Ray's process tree) that was not there before the test."""
    before = {p.pid for p in seat_processes("lt-", prefix=True)}  # this module's seats are lt-*
    yield
    strays = [p for p in descendants(shared.holder) if p.pgid != shared.holder_pgid]
    strays += [p for p in seat_processes("lt-", prefix=True) if p.pid not in before]
    assert strays == [], strays


def _assert_seat_gone(shared: Shared, name: str, home: Path, pgids: Sequence[int] = (),
                      agents: Sequence[Proc] = ()) -> None:
    doc = ray_inspect(shared.address, f"sgl-seat-{name}")
    assert live_groups(doc, f"sgl-seat-{name}-pg") == [], doc["pgs"]
    assert doc["actors"] == []
    assert in_groups(pgids) == []
    assert wait_until(lambda: alive(agents) == [], 10), alive(agents)
    assert not (home / "seats" / f"{name}.json").exists()


def _agent_procs(st: dict[str, Any]) -> list[Proc]:
    out = []
    for n in st["nodes"]:
        if n["agent_pid"]:
            out.append(Proc(n["agent_pid"], psutil.Process(n["agent_pid"]).create_time(), None, "agent"))
    return out


@pytest.mark.slow  # full tier only (README, "The tests")
def test_second_up_is_refused_and_a_killed_node1_engine_fails_the_seat(shared: Shared, clean: None,
                                                                      tmp_path: Path) -> None:
    """GIVEN a READY seat WHEN `up` runs again THEN it is refused and the seat is untouched; WHEN node 1's
    engine is SIGKILLed THEN `status` says FAILED within 10 s naming node 1; `down` then cleans up."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-fail", address=shared.address, slot=1)
    up = run_cli(["up", "--seat", str(spec), "--draft", "on", "--timeout", "180"], home)
    assert up.returncode == 0, up.stdout + up.stderr
    endpoint = endpoint_of(up.stdout)
    follower: subprocess.Popen[str] | None = None
    pgids: list[int] = []
    agents: list[Proc] = []
    try:
        again = run_cli(["up", "--seat", str(spec)], home, timeout=120)
        assert again.returncode != 0
        assert "already recorded as READY" in again.stderr and "second `up` is refused" in again.stderr
        st = status_json("lt-fail", home)
        assert st["state"] == "READY" and st["endpoint"] == endpoint
        pgids, agents = engine_pgids(st), _agent_procs(st)

        # `logs -f` streams lines written after it started (a request makes node 0 log one); Ctrl-C ends it.
        follower = subprocess.Popen([*cli_argv(), "logs", "lt-fail", "--node", "0", "-f", "--lines", "0"],
                                    env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    cwd=tmp_path)
        # A request every 3 s until the follower has printed something (at most 10), not one after a fixed 4 s:
        # a loaded box (the real-engine module of stream `other` beside this one) can take longer to start it.
        time.sleep(4.0)
        for _ in range(10):
            r = httpx.post(f"{endpoint}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 40}},
                           timeout=60)
            assert r.status_code == 200
            time.sleep(3.0)
            if select.select([follower.stdout], [], [], 0)[0]:
                break
        follower.send_signal(signal.SIGINT)
        followed, _ = follower.communicate(timeout=30)
        assert follower.returncode == 0 and followed.strip(), followed

        node1 = st["nodes"][1]["engine_pid"]
        t0 = time.monotonic()
        os.kill(node1, signal.SIGKILL)
        state, reason = "", ""
        while time.monotonic() - t0 < 10.0:
            st = status_json("lt-fail", home)
            state, reason = st["state"], st["reason"] or ""
            if state == "FAILED":
                break
        elapsed = time.monotonic() - t0
        assert state == "FAILED" and elapsed < 10.0, (state, elapsed)
        assert reason.startswith(f"node 1 engine (pid {node1}) killed by SIGKILL"), reason
        assert st["log_tail"], "a FAILED seat keeps the log tail"
    finally:
        if follower is not None and follower.poll() is None:  # a `logs -f` that did not stop: not left behind
            follower.kill()
            follower.communicate(timeout=10)
        down = run_cli(["down", "lt-fail"], home, timeout=180)  # whatever failed above, the next test starts clean
    assert down.returncode == 0, down.stdout + down.stderr
    _assert_seat_gone(shared, "lt-fail", home, pgids, agents)


def test_three_nodes_on_a_two_node_cluster_fail_in_time_with_resources(shared: Shared, clean: None,
                                                                       tmp_path: Path) -> None:
    """GIVEN a 2-node cluster WHEN a 3-node seat is brought up with --timeout 8 THEN `up` fails soon after
    8 s, shows the cluster's available and total resources beside the request, and leaves no group."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-three", address=shared.address, slot=2, nodes=3)
    t0 = time.monotonic()
    up = run_cli(["up", "--seat", str(spec), "--timeout", "8"], home, timeout=120)
    elapsed = time.monotonic() - t0
    assert up.returncode != 0
    err = up.stderr
    assert "could not be placed within the 8 s timeout" in err, err
    assert "3 bundles" in err and "cluster available:" in err and "cluster total:" in err and "GPU: 4" in err
    assert elapsed < 8 + 20, elapsed  # CLI start + connect + removal on a 2-core machine
    _assert_seat_gone(shared, "lt-three", home)


def test_port_in_use_fails_preflight_naming_node_and_port(shared: Shared, clean: None, tmp_path: Path) -> None:
    """GIVEN something listening on the seat's HTTP port WHEN `up` THEN preflight fails naming the node and
    the port, before any engine starts, and nothing of the seat is left."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-port", address=shared.address, slot=3)
    http = yaml.safe_load(spec.read_text())["network"]["http_port"]
    with held(http, listen=True):
        up = run_cli(["up", "--seat", str(spec), "--timeout", "120"], home, timeout=180)
    assert up.returncode != 0
    assert "preflight failed" in up.stderr, up.stderr
    assert f"node 0: ports-free: http port {http} is in use" in up.stderr
    assert "ok engine-node0" not in up.stdout
    _assert_seat_gone(shared, "lt-port", home)


def test_sigint_during_up_leaves_nothing_behind(shared: Shared, clean: None, tmp_path: Path) -> None:
    """GIVEN `up` with node 0's engine already running WHEN it gets SIGINT (Ctrl-C) THEN it takes down
    everything it started: engines' groups, agents, the placement group and the record."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-int", address=shared.address, slot=4)
    before = {p.pid for p in descendants(shared.holder)}
    proc = subprocess.Popen([*cli_argv(), "up", "--seat", str(spec), "--timeout", "180"], env=cli_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "ok engine-node0" in line:
                break
        assert any("ok engine-node0" in ln for ln in seen), "".join(seen) + (proc.stderr.read() if proc.stderr else "")
        # At once: `up` goes on to READY in seconds, and a scan of the cluster's processes first let it get there
        # on a loaded box (the SIGINT then came too late and the seat stayed up).
        proc.send_signal(signal.SIGINT)
        started = [p for p in descendants(shared.holder) if p.pid not in before] + seat_processes("lt-int")
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.returncode == 0:  # finished before the signal: take the seat down so later tests start clean
            run_cli(["down", "lt-int"], home, timeout=180)
    assert proc.returncode != 0
    assert "interrupted" in err, err
    node0 = int(re.search(r"ok engine-node0 .* pid (\d+)", "".join(seen)).group(1))  # type: ignore[union-attr]
    assert alive([p for p in started if p.pgid != shared.holder_pgid]) == []
    assert not any(p.pid == node0 for p in seat_processes("lt-int")), "node 0's engine outlived the interrupt"
    engine_groups = sorted({node0, *(p.pgid for p in started if p.pgid and p.pgid != shared.holder_pgid)})
    _assert_seat_gone(shared, "lt-int", home, engine_groups)


@pytest.mark.slow  # full tier only (README, "The tests")
def test_a_hung_rank_makes_the_seat_degraded_not_ready(shared: Shared, clean: None, tmp_path: Path) -> None:
    """GIVEN `up --no-watchdog --fault rowfetch-stall` on rank 3 (fires 12 s after start) WHEN it fires THEN every
    process is still alive but rank 0's /health_generate cannot finish, so `status` says DEGRADED (never READY from
    a rank >= 1 answer); `down` takes the hung seat down. With the watchdog on, its latch makes the same seat HUNG
    with the bundle named (tests/integration/test_watchdog_seat.py); here health alone decides."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-hang", address=shared.address, slot=5)
    up = run_cli(["up", "--seat", str(spec), "--no-watchdog", "--fault", "rowfetch-stall:rank=3,after_s=12",
                  "--timeout", "120"], home, timeout=180)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = status_json("lt-hang", home)
        pgids = engine_pgids(st)
        state = st["state"]
        deadline = time.monotonic() + 40
        while state != "DEGRADED" and time.monotonic() < deadline:
            time.sleep(1.0)
            st = status_json("lt-hang", home)
            state = st["state"]
        assert state == "DEGRADED", st
        assert "/health_generate" in (st["reason"] or "")
        assert all(r["alive"] for n in st["nodes"] for r in n["ranks"])
    finally:
        down = run_cli(["down", "lt-hang"], home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    _assert_seat_gone(shared, "lt-hang", home, pgids)


@pytest.mark.slow  # full tier only (README, "The tests")
def test_spec_watchdog_disabled_starts_no_sidecar(shared: Shared, clean: None, tmp_path: Path) -> None:
    """GIVEN a spec with ``watchdog.enabled: false`` WHEN `up` THEN no sidecar stage runs and only the node agents
    live in the seat's namespace, as with --no-watchdog. (`up --json` and `down --json` end to end, too.)"""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-nowd", address=shared.address, slot=8)
    doc = yaml.safe_load(spec.read_text())
    doc["watchdog"]["enabled"] = False
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    up = run_cli(["up", "--seat", str(spec), "--timeout", "180", "--json"], home)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        doc = json.loads(up.stdout)  # --json: the JSON alone on stdout, the stages' progress on stderr
        assert doc["state"] == "READY" and doc["endpoint"].startswith("http://127.0.0.1:"), doc
        names = [s["name"] for s in doc["stages"]]
        assert names[0] == "cluster" and names[-1] == "ready" and "sidecars" not in names, names
        assert " sidecars " not in up.stderr and "ok ready" in up.stderr, up.stderr
        actors = ray_inspect(shared.address, "sgl-seat-lt-nowd")["actors"]
        assert sorted(a["name"] for a in actors) == ["sgl-seat-lt-nowd-node0", "sgl-seat-lt-nowd-node1"], actors
    finally:
        down = run_cli(["down", "lt-nowd", "--json"], home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    gone = json.loads(down.stdout)
    assert gone["state"] == "STOPPED" and gone["survivors"] == [] and "engines" in [s["name"] for s in gone["stages"]]
    _assert_seat_gone(shared, "lt-nowd", home)


def test_bad_fault_is_refused_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-badfault", address="127.0.0.1:1", slot=6)
    res = run_cli(["up", "--seat", str(spec), "--fault", "explode:rank=1"], home, timeout=CLI_S)
    assert res.returncode == 2 and "unknown kind 'explode'" in res.stderr, res.stderr
    assert not (home / "seats").exists() or not any((home / "seats").iterdir())
