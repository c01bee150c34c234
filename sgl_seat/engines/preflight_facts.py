"""Facts a node agent gathers for the preflight checks (the impure half of ``preflight``).

Kept small and separate so that :mod:`sgl_seat.engines.preflight` stays pure: these read the
host (interfaces, RDMA devices, ports, the GPU listing) and nothing here decides pass or fail.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil

IB_SYSFS = Path("/sys/class/infiniband")


def interfaces() -> list[str]:
    return sorted(psutil.net_if_addrs())


def local_addresses() -> set[str]:
    """Every address of this host's interfaces (of its network namespace)."""
    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}


def ib_devices(root: Path = IB_SYSFS) -> dict[str, list[int]]:
    """RDMA devices and their port numbers, as /sys/class/infiniband lists them."""
    out: dict[str, list[int]] = {}
    if not root.is_dir():
        return out
    for dev in sorted(root.iterdir()):
        ports = dev / "ports"
        out[dev.name] = sorted(int(p.name) for p in ports.iterdir() if p.name.isdigit()) if ports.is_dir() else []
    return out


def nvidia_gpus(timeout: float = 10.0) -> list[str] | None:
    """``nvidia-smi -L`` lines, or ``None`` when nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return [ln for ln in res.stdout.splitlines() if ln.startswith("GPU ")]


def port_holder(port: int, host: str) -> str | None:
    """Why ``port`` cannot be bound on ``host`` (the address the engine will bind), or ``None`` if it can.

    Binds with SO_REUSEADDR like the engines' servers do, so a port in TIME_WAIT after a recent
    ``down`` counts as free while a listener or bound socket on ``host`` or on every address does not.
    """
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"something on this node is bound to {host}:{port}"
            return f"cannot bind {host}:{port}: {exc.strerror}"
    return None


def tcp_connect(host: str, port: int, timeout: float) -> str | None:
    """One TCP connect with a timeout: ``None`` on success, else the error text."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def wait_connectable(host: str, port: int, deadline: float, *, attempt_timeout: float = 2.0,
                     interval: float = 0.2) -> str | None:
    """Retry :func:`tcp_connect` until it works or ``deadline`` (monotonic) passes; last error or None."""
    err: str | None = "not tried"
    while True:
        err = tcp_connect(host, port, min(attempt_timeout, max(0.1, deadline - time.monotonic())))
        if err is None or time.monotonic() >= deadline:
            return err
        time.sleep(interval)


def path_exists(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))
