"""A node's look at its own side, the impure half of :mod:`sgl_seat.core.isolation`.

Reads what the kernel says of the seat's interfaces and RDMA ports (sysfs, so inside a network namespace the
namespace's own links: ``ip netns exec`` mounts its own sysfs, and the sidecar runs under that node's raylet) and
tries a TCP connect to the Ray head. Which interfaces are the seat's: those the plan names for this node (the
host's ``interfaces`` in the spec, and the names in ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` of its env),
else the interface that carries the node's own address.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from sgl_seat.core.isolation import HeadReach, LinkState, RdmaPort, SelfCheck
from sgl_seat.engines.preflight_facts import local_addresses

NET_SYSFS = Path("/sys/class/net")
IB_SYSFS = Path("/sys/class/infiniband")
#: Seconds a connect to the Ray head may take: a cut-off route times out, a healthy one answers in milliseconds.
HEAD_CONNECT_S = 0.5
_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def seat_interfaces(node_plan: Mapping[str, Any] | None, node_ip: str | None = None) -> list[str]:
    """The interfaces this node's seat traffic uses (see the module doc); [] when none can be told."""
    names: list[str] = []
    if node_plan:
        names += [str(n) for n in node_plan.get("expect_interfaces") or []]
        env = node_plan.get("env") or {}
        pairs = env.items() if isinstance(env, Mapping) else [tuple(p) for p in env]
        for k, v in pairs:
            if k in _IFNAME_VARS and isinstance(v, str) and not v.startswith("^"):
                names += [n.strip().lstrip("=") for n in v.split(",") if n.strip()]
    if not names and node_ip:
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.address == node_ip for a in addrs):
                names.append(name)
    return list(dict.fromkeys(n for n in names if n and "/" not in n and n not in (".", "..")))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # carrier of a link that is administratively down reads EINVAL
        return None


def read_links(names: Iterable[str], root: Path = NET_SYSFS) -> tuple[LinkState, ...]:
    out = []
    for name in names:
        d = root / name
        if not d.exists():
            out.append(LinkState(name=name, exists=False))
            continue
        carrier = _read(d / "carrier")
        out.append(LinkState(name=name, exists=True, operstate=_read(d / "operstate"),
                             carrier=None if carrier not in ("0", "1") else carrier == "1"))
    return tuple(out)


def read_rdma(root: Path = IB_SYSFS) -> tuple[RdmaPort, ...]:
    out = []
    if not root.is_dir():
        return ()
    for dev in sorted(root.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for p in sorted(ports.iterdir()):
            if p.name.isdigit():
                out.append(RdmaPort(device=dev.name, port=int(p.name), state=_read(p / "state") or "unreadable"))
    return tuple(out)


def reach_head(address: str, timeout: float = HEAD_CONNECT_S) -> HeadReach:
    """A TCP connect to ``host:port`` (the GCS), closed at once."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    local = host in local_addresses() or host in ("127.0.0.1", "localhost", "::1")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return HeadReach(address=address, reachable=True, local=local)
    except (OSError, ValueError) as exc:
        return HeadReach(address=address, reachable=False, local=local, error=f"{type(exc).__name__}: {exc}"[:160])


def take(node: int, t: float, *, interfaces: Iterable[str], head_address: str | None, silent: Mapping[int, str],
         peers: int, net_root: Path = NET_SYSFS, ib_root: Path = IB_SYSFS) -> SelfCheck:
    """This node's check now: its links, its RDMA ports, the head (when its address is known)."""
    return SelfCheck(node=node, t=t, links=read_links(interfaces, net_root), rdma=read_rdma(ib_root),
                     head=reach_head(head_address) if head_address else None, silent=dict(silent), peers=peers)


def links_down(interfaces: Iterable[str], root: Path = NET_SYSFS) -> tuple[LinkState, ...]:
    """The seat's interfaces that are not up right now (the tick's cheap check: two small sysfs reads each)."""
    return tuple(ln for ln in read_links(interfaces, root) if not ln.up)
