"""A seat on two real hosts (issue 11): two network namespaces, each with its own address, its own interface
name and its own raylet (token auth on), the driver on host a like an operator's login on the head.

What it shows: per-host settings follow the host Ray picked for each node rank (the interface names differ, so
a per-rank env would fail preflight on one of the two placements), a pin moves node 0 to the other host, each
node's address is in ``status --json``, a client without the token is refused, and ``down`` leaves no engine
process in either namespace. Wall time (measured, 2 shared cores): 2 s for the cluster, about 23 s for one
`up` + `down`, 20 s for the refused client (Ray retries before it gives up), 11 s for the cluster's removal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from launchutil import LOCAL_SIM, MODEL_CONFIG
from netnsutil import TOKEN_ENV, NetnsCluster, cannot_run, engine_pids, start, stop

pytestmark = pytest.mark.integration

_WHY = cannot_run()


@pytest.fixture(scope="module")
def netns_cluster() -> Iterator[NetnsCluster]:
    if _WHY:
        pytest.skip(_WHY)
    prefix = f"sg{os.getpid() % 100000}"
    # A short state path: Ray's unix sockets live under it and a socket path is limited to 107 bytes.
    state = Path(f"/tmp/{prefix}")
    cl = start(prefix, state)
    try:
        yield cl
    finally:
        left = stop(cl)
        assert not left, left


def _spec(cl: NetnsCluster, path: Path, *, pin_node0: str | None = None) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    doc["name"] = "netns-sim"
    doc["model"]["config"] = str(MODEL_CONFIG)
    hosts = []
    for name, addr, ifn in (("a", cl.addr_a, cl.if_a), ("b", cl.addr_b, cl.if_b)):
        h: dict[str, Any] = {"name": name, "address": addr, "env": {"GLOO_SOCKET_IFNAME": ifn}, "interfaces": [ifn],
                             "ray_resource": f"sgl-host-{name}"}
        if pin_node0 == name:
            h["node_rank"] = 0
        hosts.append(h)
    doc["cluster"].update(address=cl.gcs, token_env=TOKEN_ENV, hosts=hosts)
    doc["network"].pop("node_env")
    doc["network"].update(env={}, host="0.0.0.0", http_port=39410, dist_init_port=39415)
    path.write_text(yaml.safe_dump(doc))
    return path


def _up_check_down(cl: NetnsCluster, spec: Path, home: Path) -> dict[int, str]:
    """`up` (READY), check every node's env against the namespace it runs in, `down`; node rank -> host name."""
    res = cl.run_cli(["up", "--seat", str(spec), "--timeout", "180"], home, timeout=240)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        st = cl.run_cli(["status", "netns-sim", "--json"], home, timeout=60)
        assert st.returncode == 0, st.stderr
        doc = json.loads(st.stdout)
        assert doc["state"] == "READY"
        rec = json.loads((home / "seats" / "netns-sim.json").read_text())
        want = {cl.addr_a: ("a", cl.if_a), cl.addr_b: ("b", cl.if_b)}
        hosts = {}
        for node, planned in zip(doc["nodes"], rec["plan"]["nodes"], strict=True):
            host, ifn = want[node["address"]]
            assert node["host"] == host
            assert planned["env"]["GLOO_SOCKET_IFNAME"] == ifn
            hosts[node["node_rank"]] = host
        assert {ns for ns, _, _ in engine_pids(cl)} == {cl.ns_a, cl.ns_b}  # an engine on each host
        recorded = [p for n in doc["nodes"] for p in n["pids"]]
        assert recorded
    finally:
        down = cl.run_cli(["down", "netns-sim"], home, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert list(engine_pids(cl)) == []
    assert [p for p in recorded if psutil.pid_exists(p)] == []
    return hosts


def test_env_follows_the_host_and_a_pin_moves_node0(netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    """Node 0 pinned to host b (the worker, not the head): a per-rank env listing host a's interface first
    would fail preflight here; the per-host env gives each node its own host's interface. One `up` only, to
    keep CI's time (the unpinned placement, either way round, is held by tests/unit/test_plan_hosts.py)."""
    cl = netns_cluster
    hosts = _up_check_down(cl, _spec(cl, tmp_path / "pinned.yaml", pin_node0="b"), tmp_path / "home")
    assert hosts == {0: "b", 1: "a"}


def test_a_client_without_the_token_is_refused(netns_cluster: NetnsCluster) -> None:
    cl = netns_cluster
    code = ("import ray, sys\ntry:\n    ray.init(address=sys.argv[1], logging_level=40)\nexcept Exception as e:\n"
            "    print('REFUSED', type(e).__name__); sys.exit(3)\nprint('CONNECTED')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    res = subprocess.run(["ip", "netns", "exec", cl.ns_a, "timeout", "60", sys.executable, "-c", code, cl.gcs],
                         env=env, capture_output=True, text=True, timeout=90, check=False)
    assert res.returncode == 3 and "REFUSED" in res.stdout, res.stdout + res.stderr[-2000:]
