"""A seat on two real hosts (issue 11): two network namespaces, each with its own address, its own interface
name and its own raylet (token auth on), the driver on host a like an operator's login on the head.

What it shows: per-host settings follow the host Ray picked for each node rank (the interface names differ, so
a per-rank env would fail preflight on one of the two placements), a pin moves node 0 to the other host, each
node's address is in ``status --json``, node 1's link going down under traffic gives node-unreachable bundles
on both sides that `bundle merge` joins, a client without the token is refused, and ``down`` leaves no engine
process in either namespace. Wall time (measured, 2 shared cores): 13 s for the cluster, 46-56 s for the seat
(`up`, the link down and back, `down`), 21 s for the refused client (Ray retries before it gives up), 6 s for
the removal.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
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


def _up_check_down(cl: NetnsCluster, spec: Path, home: Path,
                   during: Callable[[dict[int, str], Path], None] | None = None) -> dict[int, str]:
    """`up` (READY), check every node's env against the namespace it runs in, run ``during`` (node rank -> host
    name, the seat's bundle directory), `down`; returns node rank -> host name."""
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
        if during is not None:
            during(hosts, Path(rec["bundles_dir"]))
    finally:
        down = cl.run_cli(["down", "netns-sim"], home, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert list(engine_pids(cl)) == []
    assert [p for p in recorded if psutil.pid_exists(p)] == []
    return hosts


def _traffic(url: str, stop: threading.Event) -> None:
    """Completions in a loop (direct, never through a proxy) so that the ranks run collectives across the hosts."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"model": "sim-dsv41", "prompt": "hello " * 20, "max_tokens": 32}).encode()
    while not stop.is_set():
        try:
            req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            opener.open(req, timeout=5).read()
        except OSError:
            stop.wait(0.2)


def _bundles(root: Path) -> list[dict[str, Any]]:
    out = []
    for m in sorted(root.glob("*/manifest.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append({**json.loads(m.read_text()), "path": str(m.parent)})
    return out


def _link_down(cl: NetnsCluster, home: Path) -> Callable[[dict[int, str], Path], None]:
    def during(hosts: dict[int, str], bundles: Path) -> None:
        stop = threading.Event()
        pumps = [threading.Thread(target=_traffic, args=(f"http://{cl.addr_of(hosts[0])}:39410", stop), daemon=True)
                 for _ in range(4)]
        for t in pumps:
            t.start()
        link = cl.link_of(hosts[1])
        try:
            time.sleep(4.0)  # traffic flowing across the hosts first
            subprocess.run(["ip", "link", "set", link, "down"], check=True, timeout=10)
            t_down = time.monotonic()
            coord = local = None
            while time.monotonic() - t_down < 40 and (coord is None or local is None):
                for b in _bundles(bundles):
                    if b["nodes"] == [0] and coord is None:
                        coord = (b, time.monotonic() - t_down)
                    if b["nodes"] == [1] and local is None:
                        local = b
                time.sleep(0.25)
        finally:
            stop.set()
            subprocess.run(["ip", "link", "set", link, "up"], check=True, timeout=10)
        assert coord is not None, f"no bundle from node 0 within 40 s: {_bundles(bundles)}"
        b, took = coord
        # Acceptance target: 10 s (measured 9.7 s here: 5 samples at 1 Hz to detect, a 3 s ping, the capture).
        assert took < 15.0, f"the bundle came {took:.1f} s after the link went down"
        v = b["verdict"]
        assert (v["kind"], v["node"], v["node_ranks"]) == ("node-unreachable", 1, [2, 3]), v
        assert "every rank waits in a collective" not in json.dumps(b)
        assert local is not None, "node 1 wrote no local partial bundle while cut off"
        assert (local["verdict"]["kind"], local["verdict"]["node"]) == ("node-unreachable", 0)
        rep = cl.run_cli(["replay", b["path"], "--json"], home, timeout=60)
        assert rep.returncode == 0, rep.stderr
        doc = json.loads(rep.stdout)
        assert doc["verdict"]["kind"] == "node-unreachable"
        assert "node 1 (ranks 2, 3) missing from this bundle" in doc["divergence"]["summary"]
        # Both sides reachable again: the two parts join into one bundle over every rank that replay reads.
        merged = cl.run_cli(["bundle", "merge", b["path"], local["path"], "--into", str(home / "merged"), "--json"],
                            home, timeout=60)
        assert merged.returncode == 0, merged.stdout + merged.stderr
        assert json.loads(merged.stdout)["nodes"] == [0, 1]
        rep = cl.run_cli(["replay", json.loads(merged.stdout)["path"], "--json"], home, timeout=60)
        assert rep.returncode == 0, rep.stderr
        assert "missing from this bundle" not in json.loads(rep.stdout)["divergence"]["summary"]

    return during


def test_env_follows_the_host_and_a_pin_moves_node0_then_node1_link_down(netns_cluster: NetnsCluster,
                                                                       tmp_path: Path) -> None:
    """Node 0 pinned to host b (the worker, not the head): a per-rank env listing host a's interface first
    would fail preflight here; the per-host env gives each node its own host's interface. Then the link of the
    host holding node 1 goes down under traffic: node 0's coordinator writes a node-unreachable bundle naming
    node 1 and ranks 2-3, node 1 writes its own partial bundle, and once the link is back `down` leaves no engine
    process. One `up` only, to keep CI's time (the unpinned placement, either way round, is held by
    tests/unit/test_plan_hosts.py)."""
    cl = netns_cluster
    home = tmp_path / "home"
    hosts = _up_check_down(cl, _spec(cl, tmp_path / "pinned.yaml", pin_node0="b"), home, _link_down(cl, home))
    assert hosts == {0: "b", 1: "a"}


def test_a_client_without_the_token_is_refused(netns_cluster: NetnsCluster) -> None:
    cl = netns_cluster
    code = ("import ray, sys\ntry:\n    ray.init(address=sys.argv[1], logging_level=40)\nexcept Exception as e:\n"
            "    print('REFUSED', type(e).__name__); sys.exit(3)\nprint('CONNECTED')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    res = subprocess.run(["ip", "netns", "exec", cl.ns_a, "timeout", "60", sys.executable, "-c", code, cl.gcs],
                         env=env, capture_output=True, text=True, timeout=90, check=False)
    assert res.returncode == 3 and "REFUSED" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "InvalidAuthToken" in res.stderr, res.stderr[-2000:]  # refused for the token, not for anything else
