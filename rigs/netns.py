"""The two-host test cluster (issue 11): ``scripts/netns-cluster.sh`` driven from a test, and the CLI run
as a driver inside host a's network namespace.

Two network namespaces on a bridge are two hosts with their own addresses (198.18.0.0/15 only) and their
own interface names; each runs its own raylet (`ray start`, token auth on). Creating them needs root
(CAP_NET_ADMIN); where that is missing the tests are skipped with the reason. Every check of processes is
by pid: the pids ``ip netns pids`` lists in the two namespaces, which only these tests started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from rigs.checkout import LOCAL_SIM, MODEL_CONFIG, REPO, cli_argv
from sgl_seat.forensics.recording.loadgen import Load, posting, request_body

SCRIPT = REPO / "scripts" / "netns-cluster.sh"
TOKEN_ENV = "SGLSEAT_TEST_RAY_TOKEN"


@dataclass(frozen=True)
class NetnsCluster:
    """What ``netns-cluster.sh up`` wrote to its env file."""

    prefix: str
    state: Path
    ns_a: str
    ns_b: str
    addr_a: str
    addr_b: str
    if_a: str
    if_b: str
    gcs: str
    token: str

    def env(self) -> dict[str, str]:
        return {"NETNS_PREFIX": self.prefix, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}

    def ns_of(self, addr: str) -> str:
        return {self.addr_a: self.ns_a, self.addr_b: self.ns_b}[addr]

    def addr_of(self, host: str) -> str:
        return {"a": self.addr_a, "b": self.addr_b}[host]

    def link_of(self, host: str) -> str:
        """The bridge side of a host's link (``ip link set <it> down`` cuts that host off)."""
        return f"{self.prefix}v{host}"

    def pids(self) -> dict[str, list[int]]:
        """Every pid in each namespace, as ``ip netns pids`` lists it."""
        out = {}
        for ns in (self.ns_a, self.ns_b):
            res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=False)
            out[ns] = [int(p) for p in res.stdout.split()]
        return out

    def run_cli(self, args: list[str], home: Path, *, timeout: float = 300.0, token: bool = True,
                ns: str | None = None) -> subprocess.CompletedProcess[str]:
        """The CLI as a driver on host a (a driver needs a raylet on its own host), or in namespace ``ns``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a real cluster: no one-host mode
        env.update({"SGLSEAT_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200", "RAY_USAGE_STATS_ENABLED": "0"})
        if token:
            env[TOKEN_ENV] = self.token
        return subprocess.run(["ip", "netns", "exec", ns or self.ns_a, *cli_argv(), *args], env=env,
                              capture_output=True, text=True, timeout=timeout, check=False, cwd=home.parent)


def cannot_run() -> str | None:
    """Why the two-host cluster cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); CI runs as root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"sgprobe{os.getpid() % 100000}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10, check=False)
    if res.returncode != 0:
        return f"`ip netns add` failed here: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10, check=False)
    return None


def start(prefix: str, state: Path, timeout: float = 90.0) -> NetnsCluster:
    """``netns-cluster.sh up`` (it removes what it made if it fails)."""
    env = {**os.environ, "NETNS_PREFIX": prefix, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        res = subprocess.run(["bash", str(SCRIPT), "up", str(state)], env=env, capture_output=True, text=True,
                             timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:  # killed half-way: its own clean-up did not run
        subprocess.run(["bash", str(SCRIPT), "down", str(state)], env=env, capture_output=True, timeout=60,
                       check=False)
        raise AssertionError(f"netns-cluster.sh up did not finish within {timeout:g} s: {exc.stderr!r}") from None
    if res.returncode != 0:
        raise AssertionError(f"netns-cluster.sh up failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    kv = dict(line.split("=", 1) for line in (state / "env").read_text().splitlines() if "=" in line)
    return NetnsCluster(prefix=prefix, state=state, ns_a=kv["NETNS_A"], ns_b=kv["NETNS_B"], addr_a=kv["ADDR_A"],
                        addr_b=kv["ADDR_B"], if_a=kv["IF_A"], if_b=kv["IF_B"], gcs=kv["GCS"],
                        token=Path(kv["TOKEN_FILE"]).read_text().strip())


def stop(cl: NetnsCluster, timeout: float = 60.0) -> str:
    """``netns-cluster.sh down``; returns what it reported on failure ('' when everything went)."""
    pids = [p for ps in cl.pids().values() for p in ps]
    res = subprocess.run(["bash", str(SCRIPT), "down", str(cl.state)], env={**os.environ, **cl.env()},
                         capture_output=True, text=True, timeout=timeout, check=False)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    problems = []
    if res.returncode != 0:
        problems.append(f"down exited {res.returncode}: {res.stderr.strip()}")
    if left:
        problems.append(f"pids still alive after down: {left}")
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False).stdout
    if cl.ns_a in ns or cl.ns_b in ns:
        problems.append(f"namespaces left: {ns}")
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10, check=False)
    if cl.prefix in links.stdout:
        problems.append("links left: " + " ".join(ln.split(":")[1] for ln in links.stdout.splitlines()
                                                  if cl.prefix in ln))
    return "; ".join(problems)


def engine_pids(cl: NetnsCluster) -> Iterator[tuple[str, int, str]]:
    """(namespace, pid, title/cmdline) of every engine process (sim ranks, the sim launcher) in either namespace."""
    for ns, pids in cl.pids().items():
        for pid in pids:
            try:
                cmd = " ".join(psutil.Process(pid).cmdline())
            except psutil.Error:
                continue
            if "sglang::" in cmd or "sgl_seat.sim" in cmd:
                yield ns, pid, cmd


def raylet_pid(cl: NetnsCluster, ns: str, name: str = "raylet") -> int:
    """The raylet (or ``name``: ``gcs_server``) of the host in namespace ``ns`` (started by ``netns-cluster.sh up``:
    every pid there is ours)."""
    for pid in cl.pids()[ns]:
        try:
            if psutil.Process(pid).name() == name:
                return pid
        except psutil.Error:
            continue
    raise AssertionError(f"no {name} in {ns}")


def seat_spec(cl: NetnsCluster, path: Path, *, pin_node0: str | None = None, http_port: int = 31210) -> Path:
    """The local sim seat on the two hosts (draft on), each host with its own interface and env; ``pin_node0``: the
    host that holds node rank 0 (None: Ray picks); ``http_port``: the seat's port block starts there."""
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    doc["name"] = "netns-sim"
    doc["model"]["config"] = str(MODEL_CONFIG)
    doc["draft"]["enabled"] = True
    hosts = []
    for name, addr, ifn in (("a", cl.addr_a, cl.if_a), ("b", cl.addr_b, cl.if_b)):
        h: dict[str, Any] = {"name": name, "address": addr, "env": {"GLOO_SOCKET_IFNAME": ifn}, "interfaces": [ifn],
                             "ray_resource": f"sgl-host-{name}"}
        if pin_node0 == name:
            h["node_rank"] = 0
        hosts.append(h)
    doc["cluster"].update(address=cl.gcs, token_env=TOKEN_ENV, hosts=hosts)
    doc["network"].pop("node_env")
    doc["network"].update(env={}, host="0.0.0.0", http_port=http_port, dist_init_port=http_port + 5)
    path.write_text(yaml.safe_dump(doc))
    return path


#: Real SGLang on the two hosts (issue 38): the local-sglang rehearsal seat, one TP rank per host.
LOCAL_SGLANG = REPO / "launch" / "seats" / "local-sglang.yaml"
#: Why the engine's own TP broadcaster is off across the namespaces: SGLang 0.5.23 builds the TP group's message
#: queue after asking "are these ranks on one node?" by opening rank 0's /dev/shm segment from the others
#: (parallel_state.in_the_same_node_as); namespaces made by `ip netns` share /dev/shm, so the answer is yes, the
#: queue binds 127.0.0.1 (shm_broadcast.MessageQueue) and rank 1 connects to its own host's loopback, where nothing
#: listens: both ranks wait in wait_until_ready for ever. With the broadcaster off the TP group broadcasts over gloo
#: (its interface GLOO_SOCKET_IFNAME, the host's own). Real hosts have their own /dev/shm and need none of this.
SGLANG_NETNS_ENV = {"SGLANG_USE_MESSAGE_QUEUE_BROADCASTER": "false"}


def sglang_seat_spec(cl: NetnsCluster, path: Path, *, http_port: int = 31240, name: str = "netns-sglang") -> Path:
    """The real SGLang rehearsal seat (``local-sglang``: tiny model, random weights, CPU engine) on the two hosts:
    node 0 on host a, node 1 on host b, gloo over the namespaces' link, each host its interface."""
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SGLANG.read_text())
    doc["name"] = name
    hosts = []
    for host, addr, ifn in (("a", cl.addr_a, cl.if_a), ("b", cl.addr_b, cl.if_b)):
        hosts.append({"name": host, "address": addr, "env": {"GLOO_SOCKET_IFNAME": ifn}, "interfaces": [ifn],
                      "ray_resource": f"sgl-host-{host}", **({"node_rank": 0} if host == "a" else {})})
    doc["cluster"].update(address=cl.gcs, token_env=TOKEN_ENV, hosts=hosts)
    doc["network"].update(env=dict(SGLANG_NETNS_ENV), host="0.0.0.0", http_port=http_port,
                          dist_init_port=http_port + 5)
    path.write_text(yaml.safe_dump(doc))
    return path


def _completion(max_tokens: int, model: str = "sim-dsv41") -> dict[str, Any]:
    return request_body("/v1/completions", "hello " * 20, model=model, max_tokens=max_tokens)


def complete(url: str, timeout: float = 20.0, *, model: str = "sim-dsv41") -> dict[str, Any]:
    """One completion from the seat at ``url`` (direct, never through a proxy), its JSON answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps(_completion(8, model)).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    doc: dict[str, Any] = json.loads(opener.open(req, timeout=timeout).read())
    return doc


def seat_bundles(root: Path) -> list[dict[str, Any]]:
    """Every complete bundle's manifest under ``root``, with its ``path``."""
    out = []
    for m in sorted(root.glob("*/manifest.json")):
        if m.parent.name.startswith("."):  # still being written (renamed into place when complete)
            continue
        with contextlib.suppress(OSError, ValueError):
            out.append({**json.loads(m.read_text()), "path": str(m.parent)})
    return out


@contextlib.contextmanager
def under_traffic(cl: NetnsCluster, host0: str, http_port: int = 31210, *, model: str = "sim-dsv41") -> Iterator[None]:
    """Four clients of node 0's host sending completions in a loop (direct, never through a proxy) so that the ranks
    run collectives across the hosts, 3 s before the body runs; halted after it."""
    url = f"http://{cl.addr_of(host0)}:{http_port}"
    load = Load(posting(url, "/v1/completions", lambda i, n: _completion(32, model)), concurrency=4, pause_s=0.2,
                timeout=5.0, name="netns-traffic").start()
    try:
        time.sleep(3.0)  # traffic flowing across the hosts first
        yield
    finally:
        load.halt()


def fetch_in(ns: str, url: str, timeout: float = 10.0) -> str:
    """GET ``url`` from inside namespace ``ns`` (a process on that host), the body as text."""
    code = ("import sys, urllib.request\n"
            "print(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode(), end='')")
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, url, str(timeout)],
                         capture_output=True, text=True, timeout=timeout + 20, check=False)
    if res.returncode != 0:
        raise AssertionError(f"GET {url} from {ns}: {res.stderr[-1000:]}")
    return res.stdout


def watchdog_metric(cl: NetnsCluster, node: int, name: str, http_port: int = 31210) -> float | None:
    """``name`` of node ``node``'s watchdog exporter (its sidecar's, or its keeper's in its place), read on its own
    host's loopback at the port the seat gives it (``http_port + 15 + node``); None when nothing answers there."""
    import re

    ns = cl.ns_a if node == 0 else cl.ns_b
    try:
        text = fetch_in(ns, f"http://127.0.0.1:{http_port + 15 + node}/metrics", timeout=5.0)
    except AssertionError:
        return None
    m = re.search(rf'^{name}\{{node="{node}"\}} (\S+)$', text, re.M)
    assert m, text[:1500]
    return float(m.group(1))


def keepers(cl: NetnsCluster, ns: str) -> list[int]:
    """The watchdog keepers alive in namespace ``ns`` (by the pids the namespace lists, then their command line)."""
    out = []
    for p in cl.pids()[ns]:
        with contextlib.suppress(psutil.Error):
            if "sgl_seat.watchdog.keeper" in " ".join(psutil.Process(p).cmdline()):
                out.append(p)
    return out


@contextlib.contextmanager
def running(tag: str) -> Iterator[NetnsCluster]:
    """A two-host cluster for one test module (``tag``: two letters, kept short with the pid: Ray's unix sockets
    live under its state path and a socket path is limited to 107 bytes), removed after it with nothing left; skips
    the module where it cannot be made."""
    import pytest

    why = cannot_run()
    if why:
        pytest.skip(why)
    # A `ray start` can time out during its own startup ("The current node timed out during startup": Ray's fixed
    # 30 s) while other work loads both cores. The script removes what it made; the cluster is the caller's
    # scaffolding, not what it checks: up to three tries, each under its own prefix.
    for attempt in range(3):
        prefix = f"{tag if attempt == 0 else tag[0] + str(attempt)}{os.getpid() % 100000}"
        try:
            cl = start(prefix, Path(f"/tmp/{prefix}"))
            break
        except AssertionError as exc:
            if attempt == 2:
                raise
            print(f"netns cluster {prefix} did not start (try {attempt + 1} of 3): {str(exc).splitlines()[0][:200]}")
    try:
        yield cl
    finally:
        left = stop(cl)
        assert not left, left
