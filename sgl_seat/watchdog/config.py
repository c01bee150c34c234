"""What a sidecar is configured from: the `up` context, one :class:`SidecarConfig` per node, names and ports.

`up` and `down` (``sgl_seat.launch.sidecars``) hand the watchdog a :class:`SidecarContext`: the seat's
names, the filled plan as JSON and the spec as `up` recorded it (never the seat file read again).
:func:`sgl_seat.watchdog.actors.create_sidecar_actors` turns it into one :class:`SidecarConfig` per node (plain
data that crosses Ray as JSON). The port arithmetic of
the sidecars' own exporters and the actor names live here, so `watch` and the tests find them the same way.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import words_for
from sgl_seat.engines.base import argv_value
from sgl_seat.spec import SeatSpec, WatchdogSpec

log = logging.getLogger(__name__)

#: Seconds of quiet detectors (and progress) before a latched sidecar re-arms.
RECOVER_S = 10.0
#: Seconds between two ticks of a sidecar's loop.
TICK_S = 0.25


@dataclass(frozen=True, slots=True)
class SidecarNode:
    """One node of the seat as `up` knows it: its rank, its node agent's actor name, its address."""

    node_rank: int
    agent: str
    ip: str | None
    node_id: str | None = None  # Ray's id of the node it was placed on


@dataclass(frozen=True, slots=True)
class SidecarContext:
    """What a sidecar needs to find the seat: names, the filled plan (JSON), where the seat's bundles go
    (``bundles_dir``, as `up` resolved it: ``sgl_seat.forensics.format.layout.seat_bundles_dir``) and the spec as the
    seat record holds it (``spec``: thresholds, quota, raw prompts, the exporter's bind; None: the defaults, and a
    context that only stops sidecars needs none).

    The driver is connected to Ray in the seat's ``namespace`` when the watchdog is handed one; each node's
    sidecar goes on bundle ``node_rank`` of the placement group ``pg_name``, beside that node's agent.
    """

    seat: str
    namespace: str
    pg_name: str
    plan_json: str
    nodes: tuple[SidecarNode, ...]
    bundles_dir: str
    spec: SeatSpec | None = None
    timeout: float = 60.0


def sidecar_name(seat: str, node_rank: int) -> str:
    return f"sgl-seat-{seat}-watchdog{node_rank}"


@dataclass(frozen=True)
class SidecarConfig:
    """Everything one sidecar needs; plain data, crosses Ray as JSON."""

    seat: str
    node: int
    nnodes: int
    thresholds: dict[str, Any]
    bundle_dir: str
    quota_mb: int = 2048
    probe_dir: str | None = None
    log_path: str | None = None
    metrics_url: str | None = None
    metrics_port: int | None = None
    rank_nodes: dict[int, int] = field(default_factory=dict)
    root_pid: int | None = None
    engine_port: int | None = None
    plan: dict[str, Any] | None = None
    namespace: str | None = None
    pyspy: str | None = None
    gpu: bool = True
    recover_s: float = RECOVER_S
    tick_s: float = TICK_S
    #: Node 0: SGLang's request log directory (``--log-requests-target``); its requests go into bundles.
    request_log_dir: str | None = None
    #: ``bundles.raw_prompts``: keep prompt text in request shapes (off: lengths, counts, hashes only).
    raw_prompts: bool = False
    #: Where the exporter listens: :func:`exporter_address` of ``watchdog.exporter_bind`` and this node's address.
    exporter_addr: str = "127.0.0.1"
    #: The seat's interfaces on this node (``watchdog.selfcheck.seat_interfaces``): what it checks of its own side
    #: before it names a silent peer (``core.isolation``); the Ray head's ``host:port``, which it tries to reach.
    interfaces: list[str] = field(default_factory=list)
    head_address: str | None = None
    #: Each node's agent actor by node rank (``agents[n]``): a peer whose sidecar is silent while its agent answers
    #: is reachable, and only its watchdog is gone (a killed sidecar, restarting): no node-unreachable bundle.
    agents: list[str] = field(default_factory=list)
    #: The Ray node this sidecar was placed on at `up`: a sidecar Ray restarts on another node (its bundle moved
    #: there) would watch nothing of its node, so it refuses to start, saying why (Ray takes that as its end).
    node_id: str | None = None
    #: The seat's engine (``spec.engine``): whose process and metric names the sidecar reads by.
    engine: str = "sglang"

    def to_json(self) -> str:
        d = asdict(self)
        d["rank_nodes"] = {str(k): v for k, v in self.rank_nodes.items()}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> SidecarConfig:
        d = json.loads(text)
        d["rank_nodes"] = {int(k): int(v) for k, v in (d.get("rank_nodes") or {}).items()}
        return cls(**d)

    @property
    def words(self) -> EngineWords:
        """The engine's names for its processes and metrics (its backend's)."""
        return words_for(self.engine)

    @property
    def watchdog(self) -> WatchdogSpec:
        return WatchdogSpec.model_validate(self.thresholds)


#: The exporter of node r listens (on 127.0.0.1 unless exporter_address says otherwise) at the seat's HTTP port
#: + 15 + r (r < 5; beyond, a free port), clear of the seat's other ports: dist-init (+5 in the shipped profiles)
#: and the co-located sim nodes' listen and admin ports (``sgl_seat.sim.front.ports``);
#: tests/unit/test_watchdog_config.py checks that they never meet.
EXPORTER_PORT_OFFSET = 15


def rank0_metrics_url(plan: Mapping[str, Any], node0_ip: str | None) -> str | None:
    """Rank 0's ``/metrics``: node 0's address when the engine binds every interface, else its ``--host``."""
    argv = list(plan["nodes"][0]["command"])
    host = argv_value(argv, "--host") or "0.0.0.0"
    if host in ("0.0.0.0", "::", ""):
        host = node0_ip or (argv_value(argv, "--dist-init-addr") or "").rsplit(":", 1)[0]
    if not host or "${" in host:
        return None
    return f"http://{'[' + host + ']' if ':' in host else host}:{int(plan['http_port'])}/metrics"


def metrics_port_for(http_port: int, node_rank: int) -> int:
    """The sidecar exporter's port; 0 asks the OS for a free one (so a scrape config cannot name it)."""
    return http_port + EXPORTER_PORT_OFFSET + node_rank if node_rank < 5 else 0


LOOPBACK = "127.0.0.1"


def exporter_address(bind: str, node_ip: str | None) -> str:
    """The address a node's exporter binds, from the spec's ``watchdog.exporter_bind``: ``loopback`` is 127.0.0.1,
    ``cluster`` the node's own address (what its agent reported from Ray, ``node_ip``), anything else the address
    given. ``cluster`` without a known node address falls back to loopback, logged: a sidecar that serves only
    locally is better than none."""
    if bind == "loopback":
        return LOOPBACK
    if bind == "cluster":
        if not node_ip:
            log.warning("watchdog.exporter_bind is 'cluster' but the node's address is unknown; the exporter "
                        "binds %s", LOOPBACK)
            return LOOPBACK
        return node_ip
    return bind


def scrape_host(bind: str, node_ip: str | None) -> str:
    """The host a Prometheus scrapes a node's exporter at: where it binds, except that a wildcard bind (0.0.0.0,
    ::) is reached at the node's own address."""
    addr = exporter_address(bind, node_ip)
    try:
        wildcard = ipaddress.ip_address(addr).is_unspecified
    except ValueError:  # a host name, not an address: scraped as it is
        return addr
    return node_ip if wildcard and node_ip else addr
