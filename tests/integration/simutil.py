"""Helpers for the sim engine's integration tests: ports in 32000-32999, node processes, cleanup by pid.

``SGLSEAT_TEST_PORTS=LO-HI`` moves the port range (an engineer testing beside others picks their own).

Every node is started in its own session (process group) and stopped by that group and by the pids
recorded while it ran, never by name: other engineers run sim engines with the same ``sglang::`` titles
on this host at the same time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from sgl_seat.netports import free_block, port_range, random_starts

# Below 32768, Linux's ephemeral range: beside the other integration stream, Ray's processes take ephemeral ports
# at random, and 32768-32999 of the old range could be taken between our free-port check and the sim's bind.
PORT_LO, PORT_HI = port_range((32000, 32767))
HOST = "127.0.0.1"

# Loopback only: never let a proxy from the environment see test traffic.
hget = functools.partial(httpx.get, trust_env=False)
hpost = functools.partial(httpx.post, trust_env=False)
hdelete = functools.partial(httpx.delete, trust_env=False)
hstream = functools.partial(httpx.stream, trust_env=False)


def free_port(*, span: int = 1, avoid: set[int] | None = None) -> int:
    """A port p in our range with p..p+span-1 all free (a sim node needs p and p + 2)."""
    p = free_block(random_starts(PORT_LO, PORT_HI - span), range(span), avoid=avoid or set(), host=HOST)
    if p is None:
        raise RuntimeError(f"no free port in {PORT_LO}-{PORT_HI}")
    return p


def sim_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_SIM_")}
    env.pop("SGLSEAT_PROBE", None)
    # Gloo's own listeners on loopback too, as the local-sim seat's plan sets it.
    env.update({"SGLSEAT_SIM_STEP_FLOOR_MS": "3", "SGLSEAT_SIM_WATCHDOG_GRACE_S": "1", "GLOO_SOCKET_IFNAME": "lo"})
    env.update(extra)
    return env


@dataclass
class SimNode:
    """One ``python -m sgl_seat.sim.launch_server`` process tree."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    seen: set[int] = field(default_factory=set)

    def start(self) -> SimNode:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sgl_seat.sim.launch_server", *self.argv],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )
        self.seen.add(self.proc.pid)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.seen.update(k.pid for k in kids)
        return kids

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def listening(self) -> list[tuple[int, str, int]]:
        """(pid, address, port) of every LISTEN socket of this process tree, as psutil sees it now."""
        out = []
        for p in [psutil.Process(self.pid), *self.children()]:
            with contextlib.suppress(psutil.NoSuchProcess):
                out += [(p.pid, c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN]
        return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Kill our process group and every pid we ever saw in this tree; wait until they are gone."""
        self.children()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        procs = []
        for pid in self.seen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(pid)
                p.kill()
                procs.append(p)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        psutil.wait_procs(procs, timeout=10)

    def leftovers(self) -> list[int]:
        """Pids of this tree still alive (zombies reaped by us do not count)."""
        out = []
        for pid in self.seen:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
            except psutil.NoSuchProcess:
                pass
        return out


def wait_http(url: str, *, timeout: float, node: SimNode | None = None, status: int = 200) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if node is not None and not node.alive():
            raise AssertionError(f"{url}: the node exited early:\n{node.log()[-3000:]}")
        try:
            r = hget(url, timeout=25)
            if r.status_code == status:
                return
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.3)
    tail = node.log()[-3000:] if node is not None else ""
    raise AssertionError(f"{url} not {status} within {timeout} s ({last})\n{tail}")


def sse_events(resp: httpx.Response) -> Iterator[dict[str, Any] | str]:
    """Yield decoded ``data:`` payloads of a server-sent-events response ("[DONE]" as a string)."""
    for line in resp.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        yield data if data == "[DONE]" else json.loads(data)


def main_thread_top(dump: str) -> str:
    """The innermost Python frame of the MainThread in a ``py-spy dump`` text."""
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and '"MainThread"' in line:
            for frame in lines[i + 1 :]:
                if frame.startswith("    "):
                    return frame.strip()
                break
    return ""


def pyspy_dump(pid: int, timeout: float = 30.0) -> str:
    res = subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    return res.stdout + res.stderr
