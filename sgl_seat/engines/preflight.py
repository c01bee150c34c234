"""Preflight checks a node runs before its engine starts: pure functions over facts.

Most multi-node startup hangs in SGLang's issue tracker are an interface, address or port mistake
found only after minutes of weight loading (``reference/deploy-anchors.md`` section 4). Each check
here takes facts gathered on the node (``sgl_seat.engines.preflight_facts``) and returns
:class:`Failure` items that name the node, the check and the fix, so they can be unit-tested
without a network, a GPU or Ray. The engine backend (:meth:`~sgl_seat.engines.base.EngineBackend.local_checks`)
gathers the facts and runs the checks that apply to its engine; the node agent calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from sgl_seat.errors import PreflightError
from sgl_seat.sizing import HostReaders, check_node, needs_from_env


class Check(str, Enum):
    """Names of the checks, as failures and engine backends refer to them."""

    GPUS = "gpus"
    SOCKET_IFNAME = "socket-ifname"
    IB_HCA = "ib-hca"
    MODEL_PATH = "model-path"
    PORTS = "ports-free"
    DIST_INIT_REACHABLE = "dist-init-reachable"
    OWN_HOST = "own-host"
    ENGRAM_HOST = "engram-host-table"
    HOST_MATCH = "host-match"


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed check on one node: what is wrong and what to change."""

    node_rank: int
    check: str
    problem: str
    fix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Failure:
        return cls(node_rank=int(d["node_rank"]), check=str(d["check"]), problem=str(d["problem"]),
                   fix=str(d["fix"]))

    def line(self) -> str:
        return f"node {self.node_rank}: {self.check}: {self.problem}\n    fix: {self.fix}"


def preflight_error(failures: Sequence[Failure]) -> PreflightError:
    """One error for every failure on every node (an operator fixes them all in one go)."""
    nodes = sorted({f.node_rank for f in failures})
    head = f"preflight failed on node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}"
    return PreflightError(head + "\n  " + "\n  ".join(f.line() for f in failures),
                          fix="fix the items above and run `sgl-seat up` again", nodes=tuple(nodes))


# -- GPUs ---------------------------------------------------------------------------------------


def check_gpus(node_rank: int, expected: int, ray_gpu_ids: Sequence[str],
               visible: Sequence[str] | None) -> list[Failure]:
    """Ray gave the agent ``expected`` GPUs and, where known, the node sees at least those.

    ``visible`` is the node's own GPU listing (``nvidia-smi -L``) for real seats; ``None`` for sim
    seats, whose GPUs are Ray's fake resources and only Ray's ids count.
    """
    out: list[Failure] = []
    if len(ray_gpu_ids) != expected:
        out.append(Failure(
            node_rank, Check.GPUS.value,
            f"Ray assigned {len(ray_gpu_ids)} GPU(s) {list(ray_gpu_ids)} but the bundle asks for {expected}",
            "start this node's raylet with --num-gpus equal to cluster.gpus_per_node",
        ))
    if visible is not None:
        if not visible:
            out.append(Failure(node_rank, Check.GPUS.value, "no GPU is visible (nvidia-smi -L lists none)",
                               "check the NVIDIA driver on this node (`nvidia-smi`)"))
        else:
            bad = [g for g in ray_gpu_ids if not g.isdigit() or int(g) >= len(visible)]
            if bad:
                out.append(Failure(
                    node_rank, Check.GPUS.value,
                    f"Ray's GPU ids {bad} are not among the {len(visible)} GPU(s) this node sees",
                    "start the raylet with the node's real GPU count; do not set CUDA_VISIBLE_DEVICES for it",
                ))
    return out


# -- NCCL / Gloo interfaces ---------------------------------------------------------------------


def nccl_filter_selects(value: str, names: Iterable[str]) -> list[str]:
    """The interfaces (or HCAs) an NCCL-style filter selects, as NCCL reads the variable.

    ``a,b`` selects names starting with ``a`` or ``b``; a leading ``=`` makes the entries exact
    names; a leading ``^`` turns the list into exclusions (``^=`` exact exclusions). ``:port``
    suffixes (``NCCL_IB_HCA``) are ignored here.
    """
    spec = value.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    entries = [e.split(":")[0].strip() for e in spec.split(",") if e.strip()]

    def hit(name: str) -> bool:
        return any(name == e if exact else name.startswith(e) for e in entries)

    return [n for n in names if hit(n) != exclude]


def check_socket_ifnames(node_rank: int, env: Mapping[str, str], interfaces: Sequence[str]) -> list[Failure]:
    """``NCCL_SOCKET_IFNAME`` selects an interface; every ``GLOO_SOCKET_IFNAME`` name exists exactly.

    Gloo takes plain names only (``^lo`` gives "Unable to find address for: ^lo"), so NCCL syntax
    there is its own failure.
    """
    out: list[Failure] = []
    have = sorted(interfaces)
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl:
        chosen = nccl_filter_selects(nccl, have)
        if not chosen:
            out.append(Failure(
                node_rank, Check.SOCKET_IFNAME.value,
                f"NCCL_SOCKET_IFNAME={nccl} selects none of this node's interfaces {have}",
                "set NCCL_SOCKET_IFNAME in this host's cluster.hosts[].env (or network.node_env[<node>])"
                " to its fabric interface",
            ))
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        if gloo.lstrip().startswith(("^", "=")):
            out.append(Failure(
                node_rank, Check.SOCKET_IFNAME.value,
                f"GLOO_SOCKET_IFNAME={gloo} uses NCCL filter syntax; Gloo takes plain interface names",
                "give one concrete interface name (e.g. the one `ip route get <node 0 address>` shows)",
            ))
        else:
            missing = [n for n in (s.strip() for s in gloo.split(",")) if n and n not in interfaces]
            if missing:
                out.append(Failure(
                    node_rank, Check.SOCKET_IFNAME.value,
                    f"GLOO_SOCKET_IFNAME names {missing}, not an interface of this node {have}",
                    "set GLOO_SOCKET_IFNAME in this host's cluster.hosts[].env (or network.node_env[<node>])"
                    " to an interface that exists here",
                ))
    return out


def check_host_interfaces(node_rank: int, host: str, expected: Sequence[str],
                          interfaces: Sequence[str]) -> list[Failure]:
    """Every interface the spec expects on this host (``cluster.hosts[].interfaces``) exists here.

    A node that lands on a machine the spec describes differently (a renamed NIC, a wrong address
    in ``cluster.hosts``) is found before any engine starts, naming the host the node was matched to.
    """
    missing = [n for n in expected if n not in interfaces]
    if not missing:
        return []
    return [Failure(node_rank, Check.SOCKET_IFNAME.value,
                    f"host {host!r} should have interfaces {missing}, but this node has {sorted(interfaces)}",
                    f"fix cluster.hosts[{host}].interfaces, or its address if the node is not that host")]


def check_ib_hca(node_rank: int, value: str | None, devices: Mapping[str, Sequence[int]]) -> list[Failure]:
    """Every device in an including ``NCCL_IB_HCA`` list exists (and its ``:port``, if given).

    NCCL pairs HCAs by list position across nodes, so a missing or extra HCA is a hang, not a
    slowdown. An excluding list (``^...``) must leave at least one device.
    """
    if not value:
        return []
    have = sorted(devices)
    spec = value.strip()
    if spec.startswith("^"):
        if not nccl_filter_selects(spec, have):
            return [Failure(node_rank, Check.IB_HCA.value,
                            f"NCCL_IB_HCA={value} excludes every RDMA device of this node {have}",
                            "exclude fewer devices, or list the HCA to use")]
        return []
    exact = spec.startswith("=")
    out: list[Failure] = []
    for entry in (e.strip() for e in spec.lstrip("=").split(",")):
        if not entry:
            continue
        name, _, port = entry.partition(":")
        matches = [d for d in have if (d == name if exact else d.startswith(name))]
        if not matches:
            out.append(Failure(node_rank, Check.IB_HCA.value,
                               f"NCCL_IB_HCA names {name}, but /sys/class/infiniband has {have or 'no devices'}",
                               "set network.node_env[<node>].NCCL_IB_HCA to this node's HCAs (ibv_devinfo)"))
        elif port and port.isdigit() and not any(int(port) in devices[d] for d in matches):
            out.append(Failure(node_rank, Check.IB_HCA.value,
                               f"NCCL_IB_HCA asks for port {port} of {name}; it has ports "
                               f"{sorted({p for d in matches for p in devices[d]})}",
                               "use an existing port (ibv_devinfo shows them)"))
    return out


# -- model, ports, reachability -----------------------------------------------------------------


def check_model_path(node_rank: int, path: str, exists: bool) -> list[Failure]:
    if exists:
        return []
    return [Failure(node_rank, Check.MODEL_PATH.value, f"model path {path} does not exist on this node",
                    "copy the weights to the same path on every node, or fix model.path")]


#: The metrics exporter's name among a node's ports (the watchdog's sidecar: network.http_port + 15 + node rank).
EXPORTER_PORT = "metrics exporter"


def port_key(name: str) -> str:
    """The spec key that moves the port named ``name`` (:meth:`~sgl_seat.engines.base.EngineBackend.listen_ports`'
    names, :data:`EXPORTER_PORT`): the dist-init port is its own key; every other port a seat binds is
    ``network.http_port`` plus a fixed offset (a simulated node's listen and admin ports, the exporters)."""
    return "network.dist_init_port" if name == "dist_init" else "network.http_port"


def _move_fix(port: int, key: str) -> str:
    return (f"stop what holds port {port} (`ss -ltnp 'sport = :{port}'`), or move this seat's ports: {key} in "
            "the seat file, or `--port-base N` on the command line (every port of the seat moves with it)")


def check_ports_free(node_rank: int, ports: Mapping[str, int], holders: Mapping[int, str | None]) -> list[Failure]:
    """Each named port is free; ``holders[port]`` is the reason it is not (``None`` when free). The fix names the
    spec key that moves the port (:func:`port_key`)."""
    out = []
    for what, port in ports.items():
        why = holders.get(port)
        if why:
            out.append(Failure(node_rank, Check.PORTS.value, f"{what} port {port} is in use ({why})",
                               _move_fix(port, port_key(what))))
    return out


def check_ports_distinct(ports: Sequence[tuple[int, str, int]]) -> list[Failure]:
    """The ports of a seat's nodes that share one host, ``(node rank, name, port)``, are all different: a seat
    whose dist-init port is also one of its nodes' listen, admin or exporter ports fails at start."""
    seen: dict[int, tuple[int, str]] = {}
    out = []
    for rank, what, port in ports:
        if port in seen:
            r0, w0 = seen[port]
            key = next((k for k in (port_key(what), port_key(w0)) if k == "network.dist_init_port"),
                       port_key(what))
            out.append(Failure(rank, Check.PORTS.value,
                               f"{what} port {port} is also node {r0}'s {w0} port on this host",
                               f"change {key} so that the seat's ports do not meet (http_port + 0, 2, 10 x node "
                               "rank, 15 + node rank)"))
        else:
            seen[port] = (rank, what)
    return out


def check_dist_init_reachable(node_rank: int, addr: str, port: int, error: str | None) -> list[Failure]:
    if error is None:
        return []
    return [Failure(node_rank, Check.DIST_INIT_REACHABLE.value,
                    f"node 0's dist-init address {addr}:{port} is not reachable from here ({error})",
                    f"open TCP port {port} between the nodes (firewall, routing), and check node 0's address")]


def check_own_host(node_rank: int, first_rank: int, host: str, supported: bool) -> list[Failure]:
    """Two nodes of a seat on one host: fine for simulated nodes, a port clash for a real engine."""
    if supported:
        return []
    return [Failure(node_rank, Check.OWN_HOST.value,
                    f"node {node_rank} is on the same host as node {first_rank} ({host}); their ports would collide",
                    "run one Ray node per machine for a real seat (STRICT_SPREAD then puts each node on its own)")]


def check_engram_host_table(node_rank: int, env: Mapping[str, str], readers: HostReaders | None = None,
                            ) -> list[Failure]:
    """With SGLang's Engram host table on (the plan sets it, with the bytes this node needs): host RAM free,
    huge pages, ``ulimit -l`` for the pin, and /proc access between ranks for the shared layout."""
    needs = needs_from_env(env)
    if needs is None:
        return []
    problems = check_node(needs, readers or HostReaders())
    return [Failure(node_rank, Check.ENGRAM_HOST.value, p.split("; ")[0], p.split("; ", 1)[-1]) for p in problems]
