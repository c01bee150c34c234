"""Whose side of a partition is gone: a node's check of its own links before it blames a peer.

Why: a node cut off by its own link (its cable, its switch port, its interface) loses every peer at once, and
from its side the peers are what went silent. Blaming the peer there points the operator who reads that node's
bundle on that node's disk at the wrong machine (issue 24: node 1's partial bundle named node 0). So a sidecar
that loses peers first looks at its own side: the seat's interfaces (``/sys/class/net/<if>/operstate`` and
``carrier``), the RDMA ports where there are any (``/sys/class/infiniband/*/ports/*/state``), and whether it can
reach the Ray head. :func:`own_side_gone` is the rule; the impure reading is ``sgl_seat.watchdog.selfcheck``.

The check travels in the node's capture part and in the bundle's manifest (``self_check``, node -> check), so
``replay`` and ``bundle merge`` reach the same verdict offline: the side with the evidence names the node.
Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: operstate values of a link that carries traffic ("unknown": drivers that do not report it, e.g. loopback
#: and some virtual links; their carrier decides).
_UP_STATES = frozenset({"up", "unknown"})


@dataclass(frozen=True, slots=True)
class LinkState:
    """One of the seat's interfaces as the kernel reports it; ``exists`` False: the interface is gone."""

    name: str
    exists: bool
    operstate: str | None = None
    carrier: bool | None = None  # None: not readable (a link that is administratively down has none)

    @property
    def up(self) -> bool:
        return self.exists and (self.operstate or "unknown") in _UP_STATES and self.carrier is not False

    def describe(self) -> str:
        if not self.exists:
            return f"interface {self.name}: gone"
        carrier = {True: "1", False: "0", None: "unreadable"}[self.carrier]
        return f"interface {self.name}: operstate {self.operstate or 'unreadable'}, carrier {carrier}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "exists": self.exists, "operstate": self.operstate, "carrier": self.carrier}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LinkState:
        carrier = d.get("carrier")
        return cls(name=str(d.get("name", "?")), exists=bool(d.get("exists", False)),
                   operstate=None if d.get("operstate") is None else str(d["operstate"]),
                   carrier=carrier if isinstance(carrier, bool) else None)


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """An RDMA port's state line as sysfs gives it (``4: ACTIVE``, ``1: DOWN``)."""

    device: str
    port: int
    state: str

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state.upper()

    def describe(self) -> str:
        return f"RDMA {self.device} port {self.port}: {self.state}"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "port": self.port, "state": self.state}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RdmaPort:
        port = d.get("port")
        return cls(device=str(d.get("device", "?")), port=port if isinstance(port, int) else -1,
                   state=str(d.get("state", "")))


@dataclass(frozen=True, slots=True)
class HeadReach:
    """Whether this node reached the Ray head's address (a TCP connect); ``local``: the head runs on this host."""

    address: str
    reachable: bool
    local: bool = False
    error: str | None = None

    def describe(self) -> str:
        where = " (this host)" if self.local else ""
        if self.reachable:
            return f"Ray head {self.address}{where}: reachable"
        return f"Ray head {self.address}{where}: unreachable ({self.error or 'no answer'})"

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "reachable": self.reachable, "local": self.local, "error": self.error}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HeadReach:
        return cls(address=str(d.get("address", "?")), reachable=bool(d.get("reachable", False)),
                   local=bool(d.get("local", False)), error=None if d.get("error") is None else str(d["error"]))


@dataclass(frozen=True, slots=True)
class SelfCheck:
    """A node's view of its own side at time ``t``: what :func:`own_side_gone` judges."""

    node: int
    t: float
    links: tuple[LinkState, ...] = ()
    rdma: tuple[RdmaPort, ...] = ()
    head: HeadReach | None = None
    #: The peers this node had lost when it looked (node -> what was last seen), and how many peers it has.
    silent: Mapping[int, str] = field(default_factory=dict)
    peers: int = 0
    #: Set when this node's own share of the control plane is gone (its Ray raylet: ``watchdog.keeper``), with why.
    control: str | None = None

    def evidence(self) -> tuple[str, ...]:
        """Every fact, one line each (what the verdict carries, healthy or not)."""
        out = [self.control] if self.control else []
        out += [ln.describe() for ln in self.links]
        out += [p.describe() for p in self.rdma]
        if self.head is not None:
            out.append(self.head.describe())
        if not self.links:
            out.append("no seat interface known on this node (the plan names none and none carries its address)")
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "t": self.t, "links": [ln.to_json() for ln in self.links],
                "rdma": [p.to_json() for p in self.rdma], "head": None if self.head is None else self.head.to_json(),
                "silent": {str(k): v for k, v in sorted(self.silent.items())}, "peers": self.peers,
                "control": self.control, "isolated": bool(own_side_gone(self))}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SelfCheck:
        silent_raw = d.get("silent") or {}
        silent = {int(k): str(v) for k, v in silent_raw.items() if str(k).isdigit()} \
            if isinstance(silent_raw, Mapping) else {}
        head = d.get("head")
        node, t, peers = d.get("node"), d.get("t"), d.get("peers")
        return cls(node=node if isinstance(node, int) else -1,
                   t=float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0,
                   links=tuple(LinkState.from_json(x) for x in d.get("links") or [] if isinstance(x, Mapping)),
                   rdma=tuple(RdmaPort.from_json(x) for x in d.get("rdma") or [] if isinstance(x, Mapping)),
                   head=HeadReach.from_json(head) if isinstance(head, Mapping) else None, silent=silent,
                   peers=peers if isinstance(peers, int) else 0,
                   control=str(d["control"])[:300] if d.get("control") else None)


def own_side_gone(check: SelfCheck) -> tuple[str, ...]:
    """The evidence that this node's own link or route is gone, or () when its side looks healthy.

    - its own Ray raylet gone (``control``, from ``watchdog.keeper``): its agent and sidecar went with it;
    - a seat interface gone, down or without carrier: this node's link is gone;
    - RDMA ports present and none of them active: its fabric link is gone;
    - every peer silent (two or more of them) and the Ray head, on another host, unreachable: its route is gone.
      With a single peer that peer may be the one that went (its host holds the head, or its link dropped): no
      finding from here, the peer is named.
    """
    gone = [check.control] if check.control else []
    gone += [ln.describe() for ln in check.links if not ln.up]
    if check.rdma and not any(p.active for p in check.rdma):
        gone += [p.describe() for p in check.rdma]
    head = check.head
    if (not gone and head is not None and not head.reachable and not head.local and check.peers >= 2
            and len(check.silent) >= check.peers):
        gone.append(f"{head.describe()}, and all {check.peers} peers silent")
    return tuple(gone)


def isolated_nodes(checks: Mapping[int, SelfCheck], present: Sequence[int] | None = None) -> list[int]:
    """The nodes whose own check found their side gone (those in ``present`` only, where given)."""
    want = None if present is None else set(present)
    return sorted(n for n, c in checks.items() if (want is None or n in want) and own_side_gone(c))


def checks_from_json(raw: Any) -> dict[int, SelfCheck]:
    """The manifest's ``self_check`` (node -> check); {} for a bundle without one or with a malformed one."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[int, SelfCheck] = {}
    for k, v in raw.items():
        if str(k).isdigit() and isinstance(v, Mapping):
            out[int(k)] = SelfCheck.from_json(v)
    return out
