"""Helpers for the launch integration tests: seat specs in our port range, the CLI as a subprocess,
a shared two-node local cluster, Ray inspection from a separate process, and process-tree checks.

Ports: the launch tests own 23000-23999 (below Linux's ephemeral range, 32768-60999, and above Ray's worker
ports, 10002-19999) (other suites test concurrently in other ranges;
``SGLSEAT_TEST_PORTS=LO-HI`` moves the range, see simutil). Every
process check is by pid (with create time) or by process group of processes these tests started,
never by name across the host: other engineers' sim engines carry the same ``sglang::`` titles.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from rigs.checkout import LOCAL_SIM, MODEL_CONFIG, REPO, cli_argv  # noqa: F401  (the tests import them from here)
from sgl_seat import envcompat
from sgl_seat.netports import free_block, port_range

PORT_BASE, PORT_TOP = port_range((23000, 23999))
ONE_HOST = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


_taken: set[int] = set()


def ports(slot: int) -> tuple[int, int]:
    """(http_port, dist_init_port) for test slot ``slot``: a free block of 20 from PORT_BASE + 20*slot on.

    Our range lies below Linux's ephemeral range, but Ray's workers and the other streams' seats bind ports of
    their own in it and can hold one for a while; a block whose ports are all free right now is chosen (the
    seat uses http, http+2, +5, +10, +12), and never twice in one test session.
    """
    # 127.0.0.1: where the test seats bind (network.host), never every interface.
    base = free_block((b for b in range(PORT_BASE + 20 * slot, PORT_TOP - 18, 20) if b not in _taken),
                      (0, 2, 5, 10, 12))
    if base is None:
        raise RuntimeError(f"no free port block in {PORT_BASE}-{PORT_TOP} from slot {slot}")
    _taken.add(base)
    return base, base + 5


def write_spec(directory: Path, name: str, *, address: str, slot: int, nodes: int = 2,
               python: str | None = None) -> Path:
    """local-sim with another name, our ports, a cluster address and (for the 3-node test) another size."""
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    http, dist = ports(slot)
    doc["name"] = name
    doc["python"] = python or os.environ.get("SGLSEAT_TEST_ENGINE_PYTHON", "${agent_python}")
    doc["cluster"]["address"] = address
    doc["network"]["http_port"] = http
    doc["network"]["dist_init_port"] = dist
    doc["model"]["config"] = str(MODEL_CONFIG)
    if nodes != doc["cluster"]["nodes"]:
        gpus = nodes * doc["cluster"]["gpus_per_node"]
        doc["cluster"]["nodes"] = nodes
        doc["parallel"] = {"tp": gpus, "ep": gpus}
        doc["network"]["node_env"] = [{} for _ in range(nodes)]
        del doc["model"]["config"]  # capacity is not the point of that seat
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def local_sim_spec(directory: Path, name: str, http: int, *, draft: bool = False,
                   sections: dict[str, dict[str, Any]] | None = None) -> Path:
    """local-sim as ``name`` on HTTP port ``http`` (dist-init at +5), its planning config by absolute path, the
    draft's ``enabled`` as given; ``sections`` merges keys into top-level sections (e.g. ``watchdog``)."""
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    doc["name"] = name
    doc["network"]["http_port"] = http
    doc["network"]["dist_init_port"] = http + 5
    doc["model"]["config"] = str(MODEL_CONFIG)
    doc["draft"]["enabled"] = draft
    for section, keys in (sections or {}).items():
        doc.setdefault(section, {}).update(keys)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, **ONE_HOST, "SGLSEAT_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}


#: The bound on a CLI call that reads or acts on a seat (status, watch, logs, fault, replay) where the call's own time
#: is not what the test is about: the CLI's start alone (Python, Ray's client, the seat record) passed 60 s on a
#: 2-core box under the CI tier's load (status in the CI run of 17:23, 2026-12-06).
CLI_S = 180.0


def run_cli(args: list[str], home: Path, *, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli_argv(), *args], env=cli_env(home), capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=home.parent)


def status_json(name: str, home: Path) -> dict[str, Any]:
    res = run_cli(["status", name, "--json"], home, timeout=CLI_S)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def endpoint_of(up_stdout: str) -> str:
    for line in up_stdout.splitlines():
        if "endpoint: " in line:
            return line.split("endpoint: ", 1)[1].strip()
    raise AssertionError(f"no endpoint printed:\n{up_stdout}")


# -- processes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ctime: float
    pgid: int | None
    title: str


def _proc(p: psutil.Process) -> Proc | None:
    try:
        with p.oneshot():
            cmd = p.cmdline()
            title = cmd[0] if cmd and cmd[0].startswith("sglang::") else " ".join(cmd)[:160]
            try:
                pgid: int | None = os.getpgid(p.pid)
            except OSError:
                pgid = None
            if p.status() == psutil.STATUS_ZOMBIE:
                return None
            return Proc(p.pid, p.create_time(), pgid, title)
    except psutil.Error:
        return None


def descendants(pid: int) -> list[Proc]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [x for x in (_proc(k) for k in kids) if x is not None]


def seat_processes(seat: str, *, prefix: bool = False) -> list[Proc]:
    """Every process on this host of ``seat``'s engines (``prefix``: of every seat whose name starts with ``seat``),
    found across the whole process table:
    the plan gives each node's engine ``SGLSEAT_NAME=<seat>`` and every process of its tree inherits it; and each
    engine's own parent, its engine host (``sgl_seat/launch/host/enginehost.py``, run on the seat's ``.engines``
    directory), which is not under Ray: the engines outlive their node agent's Ray worker."""
    out = []
    for q in psutil.process_iter():
        try:
            if q.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = q.cmdline()
            host = any(a.endswith("enginehost.py") for a in cmd[:3]) and any(
                f"/{seat}" in a and "/.engines/" in a if prefix else f"/{seat}/.engines/" in a for a in cmd[2:])
            if not host:
                mark = envcompat.lookup(q.environ(), "SGLSEAT_NAME")  # or a seat of the previous release
                if mark is None or not (mark.startswith(seat) if prefix else mark == seat):
                    continue
            title = f"engine host {cmd[-1]}" if host else (cmd[0] if cmd else q.name())
            out.append(Proc(q.pid, q.create_time(), None, title[:160]))
        except (psutil.Error, OSError):
            continue
    return out


def alive(procs: Iterable[Proc]) -> list[Proc]:
    """Those of ``procs`` still running (same pid and create time, not a zombie)."""
    out = []
    for p in procs:
        try:
            q = psutil.Process(p.pid)
            if abs(q.create_time() - p.ctime) < 0.05 and q.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def in_groups(pgids: Iterable[int]) -> list[Proc]:
    """Live processes whose process group is one of ``pgids`` (engine groups these tests started)."""
    want = set(pgids)
    out = []
    for q in psutil.process_iter():
        try:
            if os.getpgid(q.pid) in want:
                p = _proc(q)
                if p is not None:
                    out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


def engine_pgids(status: dict[str, Any]) -> list[int]:
    return [n["pgid"] for n in status["nodes"] if n.get("pgid")]


def wait_until(pred: Any, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


# -- Ray, inspected from another process (the test process never becomes a Ray driver) -------------

_INSPECT = textwrap.dedent("""
    import json, logging, sys
    import ray
    from ray.util import placement_group_table
    ray.init(address=sys.argv[1], namespace=sys.argv[2], logging_level=logging.ERROR, log_to_driver=False)
    pgs = [{"name": v.get("name"), "state": v.get("state")} for v in placement_group_table().values()]
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == sys.argv[2]]
    print(json.dumps({"pgs": pgs, "actors": actors}))
    ray.shutdown()
""")


def ray_inspect(address: str, namespace: str) -> dict[str, Any]:
    """Placement groups (all, with state) and the named actors of ``namespace`` on the cluster."""
    res = subprocess.run([sys.executable, "-c", _INSPECT, address, namespace], env={**os.environ, **ONE_HOST},
                         capture_output=True, text=True, timeout=90, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    doc: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return doc


def live_groups(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [g for g in doc["pgs"] if g["name"] == name and g["state"] != "REMOVED"]


def stop_pid(p: subprocess.Popen[bytes]) -> None:
    """End a process this test started in its own session (its group), SIGTERM then SIGKILL, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(5)


class LongRequest(threading.Thread):
    """One /generate of ``tokens`` tokens with a client timeout far above any remediation (``timeout_s``): how it
    ends (an HTTP status, or the error the client read), and when."""

    def __init__(self, url: str, tokens: int = 4000, *, timeout_s: float = 600.0) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens, self.timeout_s = url, tokens, timeout_s
        self.outcome: str | None = None
        self.ended: float | None = None

    def run(self) -> None:
        body = {"text": "a long answer, please", "sampling_params": {"max_new_tokens": self.tokens, "ignore_eos": True}}
        try:
            r = httpx.post(f"{self.url}/generate", json=body, timeout=self.timeout_s, trust_env=False)
            self.outcome = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            self.outcome = f"{type(exc).__name__}: {exc}"
        self.ended = time.time()
