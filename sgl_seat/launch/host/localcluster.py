"""A local Ray cluster of simulated nodes on 127.0.0.1 that outlives `up` and is stopped by `down`.

``ray start`` cannot add a second node on one host once Ray is kept on 127.0.0.1 (DESIGN
section 8), but ``ray.cluster_utils.Cluster`` can. A ``Cluster`` lives as long as the process that
holds it, so `up` starts this module as a small detached holder process (its own session, so a
Ctrl-C in the terminal does not reach it): a head with no GPUs and one added node per seat node
with ``num_gpus = gpus_per_node`` and a fake ``sgl_seat_sim_node_<i>`` resource, dashboard off,
everything on 127.0.0.1. The holder writes ``$SGLSEAT_HOME/clusters/<seat>.json`` (its pid, the GCS
address, the Ray processes it started) and waits for SIGTERM, on which it calls
``cluster.shutdown()``. :func:`stop_local_cluster` signals it and then checks, by pid and create
time, that every process it started is gone, SIGKILLing stragglers. Nothing is ever found or
killed by name.

Run as ``python -m sgl_seat.launch.host.localcluster --seat NAME --nodes N --gpus-per-node G --record PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sgl_seat.errors import ClusterError
from sgl_seat.launch.host import processgroups
from sgl_seat.launch.seatrecord.home import clusters_dir, read_json, write_json_atomic
from sgl_seat.netports import any_free_port
from sgl_seat.niceness import RAY_WORKER_NICENESS_ENV

CLUSTER_SCHEMA_VERSION = 1
ONE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_spawned: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(kw_only=True, slots=True)
class LocalClusterRecord:
    """What the holder writes: enough for any later process to find and stop it safely."""

    seat: str
    pid: int
    create_time: float
    state: str  # "starting" | "ready" | "failed"
    gcs_address: str | None = None
    nodes: int = 0
    gpus_per_node: int = 0
    log_path: str | None = None
    error: str | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)
    schema_version: int = CLUSTER_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LocalClusterRecord:
        if d.get("schema_version") != CLUSTER_SCHEMA_VERSION:
            raise ClusterError(f"local cluster record schema_version {d.get('schema_version')!r} is unknown",
                               fix="stop that cluster with the sgl-seat version that started it")
        return cls(**d)


def cluster_record_path(seat: str) -> Path:
    return clusters_dir() / f"{seat}.json"


def load_cluster_record(path: Path) -> LocalClusterRecord | None:
    try:
        doc = read_json(path)
    except (OSError, ValueError):
        return None
    return LocalClusterRecord.from_dict(doc) if isinstance(doc, dict) else None


#: The sim's device environment (``sgl_seat.sim.args``); spelled here: launch/ does not import the sim.
SIM_DEVICE_ENV = "SGLSEAT_SIM_DEVICE"


def host_gpu_count() -> int:
    """NVIDIA GPUs of this host (``/proc/driver/nvidia/gpus``); 0 where there is no NVIDIA driver."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def node_gpu_env(index: int, nodes: int, gpus_per_node: int, host_gpus: int) -> dict[str, str]:
    """The environment simulated node ``index``'s raylet starts with.

    Why: each added node counts ``gpus_per_node`` GPUs, and Ray numbers every node's GPUs from 0, so on a host
    with real GPUs every simulated node would hand out GPU 0 and the ranks of two nodes would share a device.
    Where the host has a real GPU for every simulated one, node ``i`` is started seeing GPUs
    ``i*G .. i*G+G-1`` (Ray then hands out those real ids, the node agent sets them as the engine's
    ``CUDA_VISIBLE_DEVICES``) and the sim runs in CUDA mode (``auto``: where torch sees them). Otherwise
    nothing: the GPU count is a fake resource and the sim stays on CPU.
    """
    if gpus_per_node < 1 or host_gpus < nodes * gpus_per_node:
        return {}
    first = index * gpus_per_node
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(first + i) for i in range(gpus_per_node)), SIM_DEVICE_ENV: "auto"}


def _snapshot(pid: int) -> list[dict[str, Any]]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [i.to_dict() for i in (processgroups.info(p) for p in kids) if i is not None]


# -- the holder (runs in its own process) ----------------------------------------------------------

#: What a one-host rehearsal cluster leaves out of Ray's head, none of which sgl-seat reads: the autoscaler's
#: monitor (nothing scales: placement.py reports a group that cannot be placed itself), the log monitor (every
#: driver connects with ``log_to_driver=False``; workers' logs stay in their files), Ray's own metrics and event
#: statistics, and its task events but every 5 s (for Ray's state API, which sgl-seat does not call); and its raylets
#: report resources each second, not each 100 ms. Idle, such a cluster (a head and two
#: nodes) took 0.41 of a core here with Ray's defaults and 0.16 with these (30 s of CPU time summed per process,
#: 2026-12-06): on the 2 cores a CI run shares among two or three clusters, engines and tests, that is CPU the
#: tests' own deadlines need.
QUIET_HEAD: dict[str, Any] = {
    "no_monitor": True, "include_log_monitor": False,
    "_system_config": {"enable_metrics_collection": False, "event_stats": False,
                       "raylet_report_resources_period_milliseconds": 1000, "task_events_report_interval_ms": 5000},
}

#: Ray gives a new node a fixed 30 s to register with the GCS (``ray._private.node``, not configurable); on a
#: loaded host (a CI machine running three test streams on 2 cores) a raylet can miss it. The holder then stops
#: everything that attempt started and begins again, this many attempts in all.
START_ATTEMPTS = 3
_RAY_NODE_TIMEOUT = "timed out during startup"


def _stop_descendants() -> None:
    """SIGKILL every process this holder started (a failed attempt's head and raylets) and reap them."""
    kids = psutil.Process().children(recursive=True)
    for k in kids:
        with contextlib.suppress(psutil.Error):
            k.kill()
    psutil.wait_procs(kids, timeout=10)


#: Ports Ray's head takes by default for its other components (``ray._private.ray_constants``: the dashboard agent's
#: HTTP 52365, the dashboard 8265, the GCS 6379, the client server 10001): a GCS port drawn at random that is one of
#: them stops the head ("trying to use a port number 52365 that is used by other components", an H100 host).
RAY_DEFAULT_PORTS = frozenset({6379, 8265, 10001, 52365})


def _gcs_port() -> int:
    while (p := any_free_port()) in RAY_DEFAULT_PORTS:
        pass
    return p


def start_nodes(cluster_cls: Any, *, nodes: int, gpus_per_node: int, cpus_per_node: int, port: int,
                stop: threading.Event, attempts: int = START_ATTEMPTS) -> Any:
    """A ``cluster_cls`` (Ray's ``Cluster``) with a head and ``nodes`` simulated nodes, started over (up to
    ``attempts`` times) when Ray's own node-start wait runs out; any other failure is raised at once."""
    for attempt in range(1, attempts + 1):
        cluster: Any = None
        try:
            cluster = cluster_cls(initialize_head=True, head_node_args={
                "num_cpus": 0, "num_gpus": 0, "include_dashboard": False, "dashboard_host": "127.0.0.1",
                "node_ip_address": "127.0.0.1", "gcs_server_port": port or _gcs_port(), **QUIET_HEAD,
            })
            host_gpus = host_gpu_count()
            for i in range(nodes):
                if stop.is_set():
                    break
                # Ray reads the node's GPU ids from this process's environment, and the raylet and its workers
                # inherit it: set per node (every node gets the same keys, so the next one replaces them); this
                # process runs no engine itself.
                os.environ.update(node_gpu_env(i, nodes, gpus_per_node, host_gpus))
                cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node, node_ip_address="127.0.0.1",
                                 resources={f"sgl_seat_sim_node_{i}": 1.0})
            return cluster
        except Exception as exc:
            if cluster is not None:
                with contextlib.suppress(Exception):
                    cluster.shutdown()
            _stop_descendants()
            if _RAY_NODE_TIMEOUT not in str(exc) or attempt == attempts or stop.is_set():
                raise
            sys.stdout.write(f"Ray: a node {_RAY_NODE_TIMEOUT} (attempt {attempt} of {attempts}); starting "
                             "the cluster again\n")
            sys.stdout.flush()
    raise AssertionError("unreachable")


def serve(seat: str, nodes: int, gpus_per_node: int, cpus_per_node: int, record: Path, port: int,
          timeout: float) -> int:
    """Hold a ``Cluster`` until SIGTERM/SIGINT; returns the exit code."""
    os.environ[ONE_HOST_ENV] = "0"
    # The raylets read it at start: this cluster's workers (node agents, sidecars) and so the engines they spawn run
    # at the niceness of the `up` that started it, not 15 above it (sgl_seat.niceness); an operator's own setting
    # stands.
    os.environ.setdefault(RAY_WORKER_NICENESS_ENV, "0")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    me = psutil.Process()
    rec = LocalClusterRecord(seat=seat, pid=me.pid, create_time=me.create_time(), state="starting", nodes=nodes,
                             gpus_per_node=gpus_per_node, log_path=os.environ.get("SGLSEAT_CLUSTER_LOG"))
    write_json_atomic(record, rec.to_dict())
    from ray.cluster_utils import Cluster

    cluster: Any = None
    try:
        cluster = start_nodes(Cluster, nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
                              port=port, stop=stop)
        if not stop.is_set():
            cluster.wait_for_nodes(timeout=timeout)
            rec.state, rec.gcs_address, rec.processes = "ready", cluster.address, _snapshot(me.pid)
            write_json_atomic(record, rec.to_dict())
            sys.stdout.write(f"local Ray cluster ready at {cluster.address}\n")
            sys.stdout.flush()
        while not stop.wait(1.0):
            pass
        return 0
    except Exception as exc:
        rec.state, rec.error = "failed", f"{type(exc).__name__}: {exc}"
        write_json_atomic(record, rec.to_dict())
        raise
    finally:
        if cluster is not None:
            cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgl_seat.launch.host.localcluster", description=__doc__)
    ap.add_argument("--seat", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--cpus-per-node", type=int, default=2)
    ap.add_argument("--record", type=Path, required=True)
    ap.add_argument("--port", type=int, default=0, help="GCS port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args(argv)
    return serve(a.seat, a.nodes, a.gpus_per_node, a.cpus_per_node, a.record, a.port, a.timeout)


# -- the driver side ------------------------------------------------------------------------------


def start_local_cluster(seat: str, *, nodes: int, gpus_per_node: int, cpus_per_node: int, timeout: float,
                        record: Path | None = None, port: int = 0) -> LocalClusterRecord:
    """Start the holder detached and wait until its cluster is ready (or fail with its log tail)."""
    path = record or cluster_record_path(seat)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    log_path = path.with_suffix(".log")
    env = {**os.environ, ONE_HOST_ENV: "0", "SGLSEAT_CLUSTER_LOG": str(log_path)}
    with log_path.open("wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sgl_seat.launch.host.localcluster", "--seat", seat, "--nodes", str(nodes),
             "--gpus-per-node", str(gpus_per_node), "--cpus-per-node", str(cpus_per_node), "--record", str(path),
             "--port", str(port), "--timeout", str(max(10.0, timeout))],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    _spawned[proc.pid] = proc
    deadline = time.monotonic() + timeout
    try:
        while True:
            rec = load_cluster_record(path)
            if rec is not None and rec.state == "ready":
                return rec
            if proc.poll() is not None or (rec is not None and rec.state == "failed"):
                tail = "\n    ".join(_tail(log_path, 15))
                raise ClusterError("the local Ray cluster did not start "
                                   f"(holder {processgroups.describe_exit(proc.wait())})"
                                   f"; its log {log_path}:\n    {tail}",
                                   fix="look for leftover Ray processes of an earlier run, or free memory")
            if time.monotonic() > deadline:
                raise ClusterError(f"the local Ray cluster was not ready within {timeout:.0f} s (log {log_path})",
                                   fix="raise --timeout; Ray needs ~10 s for 3 simulated nodes on 2 cores")
            time.sleep(0.2)
    except BaseException:
        stop_local_cluster(pid=proc.pid, create_time=psutil.Process(proc.pid).create_time()
                           if proc.poll() is None else None, known=[], timeout=15.0)
        raise


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    except OSError:
        return []


def stop_local_cluster(*, pid: int, create_time: float | None, known: list[dict[str, Any]],
                       timeout: float = 30.0) -> list[processgroups.ProcInfo]:
    """Signal the holder, let it shut its Cluster down, then verify every process it started is gone.

    ``known`` are processes the holder recorded when ready; its live descendants are added before
    signalling. Stragglers get SIGKILL by pid (create time checked). Returns the survivors.
    """
    tree: list[tuple[int, float]] = [(int(k["pid"]), float(k["create_time"])) for k in known]
    holder = processgroups.find(pid, create_time)
    if holder is not None:
        tree.append((pid, holder.create_time()))
        with contextlib.suppress(psutil.Error):
            tree += [(c.pid, c.create_time()) for c in holder.children(recursive=True)]
        with contextlib.suppress(psutil.Error):
            holder.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while processgroups.is_alive(holder) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if processgroups.is_alive(holder):
            with contextlib.suppress(psutil.Error):
                holder.kill()
    _reap(pid)
    left = processgroups.members(None, known=tree)
    if left:
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=5.0)
    _reap(pid)
    return [i for i in (processgroups.info(p) for p in processgroups.members(None, known=tree)) if i is not None]


def _reap(pid: int) -> None:
    """Collect the holder's exit status when this process started it (no zombie left behind)."""
    proc = _spawned.get(pid)
    if proc is not None and proc.poll() is not None:
        _spawned.pop(pid, None)


if __name__ == "__main__":
    sys.exit(main())
