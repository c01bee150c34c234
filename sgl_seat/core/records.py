"""Typed records shared by the live watchdog and offline replay.

The sidecar builds these from py-spy, the probe rings, ``/metrics`` and psutil; a bundle stores
them as JSON lines; ``replay`` reads them back into the very same types and calls the same
``detect()``. That is what makes a replayed verdict equal the live one, so these types are the
contract: change them only with a ``RECORD_SCHEMA_VERSION`` bump.

Every record converts with ``to_json()`` / ``from_json()`` (plain dicts; never pickle). ``from_json``
is strict about types because bundles are untrusted input: it raises :class:`RecordError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

RECORD_SCHEMA_VERSION = 1


class RecordError(ValueError):
    """A record that does not have the shape its type requires."""


def _get(d: dict[str, Any], key: str, typ: type | tuple[type, ...], *, optional: bool = False) -> Any:
    if not isinstance(d, dict):
        raise RecordError(f"expected an object, got {type(d).__name__}")
    if key not in d or d[key] is None:
        if optional:
            return None
        raise RecordError(f"missing field {key!r}")
    val = d[key]
    # bool is an int in Python; a bool where a number is wanted is a shape error.
    if isinstance(val, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise RecordError(f"field {key!r}: expected {typ}, got bool")
    if not isinstance(val, typ):
        raise RecordError(f"field {key!r}: expected {typ}, got {type(val).__name__}")
    return val


_NUM = (int, float)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python (or native) frame as py-spy reports it; ``native`` frames have no line number."""

    name: str
    filename: str
    line: int = 0
    module: str | None = None
    native: bool = False

    @property
    def label(self) -> str:
        short = self.filename.rsplit("/", 1)[-1]
        return f"{self.name} ({short}:{self.line})" if self.line else f"{self.name} ({short})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "filename": self.filename, "line": self.line, "module": self.module,
                "native": self.native}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Frame:
        return cls(
            name=_get(d, "name", str),
            filename=_get(d, "filename", str),
            line=int(_get(d, "line", int, optional=True) or 0),
            module=_get(d, "module", str, optional=True),
            native=bool(_get(d, "native", bool, optional=True) or False),
        )


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread of one process at one instant; ``frames[0]`` is the innermost (py-spy's order)."""

    thread_id: int
    name: str | None
    active: bool
    owns_gil: bool
    frames: tuple[Frame, ...]

    @property
    def top(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        """What "unchanged stack" compares: names, files and lines of every frame."""
        return tuple((f.name, f.filename, f.line) for f in self.frames)

    def to_json(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "name": self.name, "active": self.active, "owns_gil": self.owns_gil,
                "frames": [f.to_json() for f in self.frames]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ThreadStack:
        frames = _get(d, "frames", list)
        return cls(
            thread_id=_get(d, "thread_id", int),
            name=_get(d, "name", str, optional=True),
            active=bool(_get(d, "active", bool, optional=True)),
            owns_gil=bool(_get(d, "owns_gil", bool, optional=True)),
            frames=tuple(Frame.from_json(f) for f in frames),
        )


@dataclass(frozen=True, slots=True)
class StackSample:
    """One py-spy dump of one engine process (or the error that prevented it).

    ``state`` (optional, added compatibly in schema 1; absent in older bundles) is the process's one-letter
    ``/proc`` state read just before the dump (``R`` running, ``S`` sleeping, ``T`` stopped, ``t`` tracing
    stop, ...): a SIGSTOP'd process may still be read by py-spy (an unchanged stack) or not at all, and only
    this says it is stopped.
    """

    t: float
    node: int
    pid: int
    title: str
    rank: int | None
    native: bool
    threads: tuple[ThreadStack, ...]
    error: str | None = None
    state: str | None = None

    def main_thread(self) -> ThreadStack | None:
        """The scheduler's work happens on the main thread (py-spy lists it first for CPython)."""
        for th in self.threads:
            if th.name == "MainThread":
                return th
        return self.threads[0] if self.threads else None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"t": self.t, "node": self.node, "pid": self.pid, "title": self.title, "rank": self.rank,
                             "native": self.native, "threads": [t.to_json() for t in self.threads],
                             "error": self.error}
        if self.state is not None:
            d["state"] = self.state
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StackSample:
        return cls(
            t=float(_get(d, "t", _NUM)),
            node=_get(d, "node", int),
            pid=_get(d, "pid", int),
            title=_get(d, "title", str),
            rank=_get(d, "rank", int, optional=True),
            native=bool(_get(d, "native", bool, optional=True)),
            threads=tuple(ThreadStack.from_json(t) for t in _get(d, "threads", list)),
            error=_get(d, "error", str, optional=True),
            state=_state(_get(d, "state", str, optional=True)),
        )


def _state(v: str | None) -> str | None:
    if v is not None and not (len(v) == 1 and v.isalpha() and v.isascii()):
        raise RecordError(f"field 'state': expected one /proc state letter, got {v[:20]!r}")
    return v


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One wrapped call (a row fetch): ``end`` is None while it is still in flight.

    ``start``/``end`` time the Python call. On a GPU the call mostly *enqueues* work, and a stalled host
    read stalls a kernel, not the call: the GPU fields (optional, added compatibly in schema 1; absent in
    older bundles) time the call's work on its CUDA stream. ``gpu`` says the probe timed it there (a CUDA
    event after the call, or after a later call of the same stream: see ``probe/gpu.py``'s ``GpuTimer``);
    ``gpu_start`` is a bound, not an event: the later of the call's start and when the engine's event reader
    saw the stream's previous probed work complete (None while the call is still queued behind earlier
    work), ``gpu_end`` when the reader saw its work complete (None while the work is in flight on the GPU).
    """

    node: int
    rank: int
    pid: int
    thread: int
    seq: int
    target: str
    start: float
    end: float | None
    gather_size: int
    gpu: bool = False
    gpu_start: float | None = None
    gpu_end: float | None = None
    graph_key: int | None = None

    @property
    def graph_replay(self) -> bool:
        """The call replayed a captured CUDA graph (its ``graph_key`` names which)."""
        return self.graph_key is not None

    def duration(self, now: float) -> float:
        """Seconds taken, or the age so far for a fetch still in flight."""
        return (self.end if self.end is not None else now) - self.start

    @property
    def in_flight(self) -> bool:
        return self.end is None

    def gpu_in_flight(self, now: float) -> bool:
        """The call's GPU work had started by ``now`` and had not finished at ``now``."""
        return (self.gpu and self.gpu_start is not None and self.gpu_start <= now
                and (self.gpu_end is None or self.gpu_end > now))

    def gpu_age(self, now: float) -> float:
        """Seconds the call's GPU work has run at ``now`` (0 when it had not started)."""
        if self.gpu_start is None or self.gpu_start > now:
            return 0.0
        return (self.gpu_end if self.gpu_end is not None and self.gpu_end <= now else now) - self.gpu_start

    def inflight_age(self, now: float) -> float | None:
        """Seconds in flight at ``now``: the call's (still running) or, once it returned, its GPU work's
        (started on the stream, not finished); None when neither is in flight (GPU work still queued counts
        as not in flight: it waits behind earlier work)."""
        if self.start <= now and (self.end is None or self.end > now):
            return now - self.start
        if self.gpu_in_flight(now):
            return self.gpu_age(now)
        return None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"node": self.node, "rank": self.rank, "pid": self.pid, "thread": self.thread,
                             "seq": self.seq, "target": self.target, "start": self.start, "end": self.end,
                             "gather_size": self.gather_size}
        if self.gpu:
            d.update(gpu=True, gpu_start=self.gpu_start, gpu_end=self.gpu_end)
        if self.graph_key is not None:
            d["graph_key"] = self.graph_key
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeRecord:
        end = _get(d, "end", _NUM, optional=True)
        return cls(
            node=_get(d, "node", int),
            rank=_get(d, "rank", int),
            pid=_get(d, "pid", int),
            thread=_get(d, "thread", int),
            seq=_get(d, "seq", int),
            target=_get(d, "target", str),
            start=float(_get(d, "start", _NUM)),
            end=None if end is None else float(end),
            gather_size=_get(d, "gather_size", int),
            gpu=bool(_get(d, "gpu", bool, optional=True) or False),
            gpu_start=_opt_float(_get(d, "gpu_start", _NUM, optional=True)),
            gpu_end=_opt_float(_get(d, "gpu_end", _NUM, optional=True)),
            graph_key=_get(d, "graph_key", int, optional=True),
        )


@dataclass(frozen=True, slots=True)
class MetricsPoint:
    """One scrape of rank 0's ``/metrics``: SGLang metric name (with ``sglang:``) -> summed value."""

    t: float
    node: int
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "node": self.node, "values": dict(self.values)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MetricsPoint:
        vals = _get(d, "values", dict)
        out: dict[str, float] = {}
        for k, v in vals.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, _NUM):
                raise RecordError(f"metrics value {k!r} is not a number")
            out[k] = float(v)
        return cls(t=float(_get(d, "t", _NUM)), node=_get(d, "node", int), values=out)


@dataclass(frozen=True, slots=True)
class EngineProcess:
    """An engine process seen on a node (by title), alive or gone with its exit code.

    ``gone_t`` (optional, added compatibly in schema 1) is when the sidecar first saw it gone: with
    several processes dying in a cascade it orders them, so the first to die is named.
    ``ports`` (optional, added compatibly in schema 1) are the local TCP ports of its sockets as last seen alive:
    a peer's collective error names the dead peer by address ("Connection closed by peer [ip]:port"), and these
    say which rank held that socket.
    ``stopped_since`` (optional, added compatibly in schema 1) is when the sidecar's 20 Hz ``/proc`` reads first saw
    it in state ``T`` (SIGSTOP) in the run of reads that lasts to the latest one; None when it was not stopped.
    """

    node: int
    pid: int
    title: str
    rank: int | None
    alive: bool
    exit_code: int | None = None
    gone_t: float | None = None
    ports: tuple[int, ...] = ()
    stopped_since: float | None = None
    #: When the sidecar last read its state (with ``stopped_since``: it was still stopped then).
    state_t: float | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"node": self.node, "pid": self.pid, "title": self.title, "rank": self.rank,
                             "alive": self.alive, "exit_code": self.exit_code}
        if self.gone_t is not None:
            d["gone_t"] = self.gone_t
        if self.ports:
            d["ports"] = list(self.ports)
        if self.stopped_since is not None:
            d["stopped_since"] = self.stopped_since
        if self.state_t is not None:
            d["state_t"] = self.state_t
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EngineProcess:
        return cls(
            node=_get(d, "node", int),
            pid=_get(d, "pid", int),
            title=_get(d, "title", str),
            rank=_get(d, "rank", int, optional=True),
            alive=bool(_get(d, "alive", bool)),
            exit_code=_get(d, "exit_code", int, optional=True),
            gone_t=_opt_float(_get(d, "gone_t", _NUM, optional=True)),
            ports=_ports(_get(d, "ports", list, optional=True)),
            stopped_since=_opt_float(_get(d, "stopped_since", _NUM, optional=True)),
            state_t=_opt_float(_get(d, "state_t", _NUM, optional=True)),
        )


def _ports(v: list[Any] | None) -> tuple[int, ...]:
    if v is None:
        return ()
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 65536 for x in v):
        raise RecordError("field 'ports': expected a list of TCP port numbers")
    return tuple(v)


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a node's engine log with the time the sidecar read it."""

    t: float
    node: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "node": self.node, "text": self.text}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LogLine:
        return cls(t=float(_get(d, "t", _NUM)), node=_get(d, "node", int), text=_get(d, "text", str))


class VerdictKind(str, Enum):
    """What a detector concluded. The values are what bundles and ``--json`` carry."""

    NO_PROGRESS = "no progress"
    STACK_UNCHANGED = "stack unchanged"
    ROWFETCH_STALL = "row-fetch stall"
    ENGINE_WATCHDOG = "engine watchdog"
    PROCESS_EXITED = "process exited"
    #: An engine process stopped (SIGSTOP, state ``T``) for ``stopped_s``: alive, but it runs no more.
    PROCESS_STOPPED = "process stopped"
    #: A whole node did not answer the capture (link down, raylet or host dead): its ranks are unseen.
    NODE_UNREACHABLE = "node-unreachable"
    #: A node whose own link or route is gone (its self-check's evidence): the node cut off, named by itself.
    NODE_ISOLATED = "node-isolated"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A detector's finding: the kind, the lagging rank and its node, its frame, and why."""

    kind: VerdictKind
    rank: int | None
    node: int | None
    frame: str | None
    t: float
    evidence: tuple[str, ...] = ()
    waiting_ranks: tuple[int, ...] = ()
    #: node-unreachable / node-isolated: the ranks on the node named (optional in schema 1: absent otherwise).
    node_ranks: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc = {"kind": self.kind.value, "rank": self.rank, "node": self.node, "frame": self.frame, "t": self.t,
               "evidence": list(self.evidence), "waiting_ranks": list(self.waiting_ranks)}
        if self.node_ranks:
            doc["node_ranks"] = list(self.node_ranks)
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Verdict:
        kind = _get(d, "kind", str)
        try:
            vk = VerdictKind(kind)
        except ValueError:
            raise RecordError(f"unknown verdict kind {kind!r}") from None
        ev = _get(d, "evidence", list, optional=True) or []
        wr = _get(d, "waiting_ranks", list, optional=True) or []
        nr = _get(d, "node_ranks", list, optional=True) or []
        if not all(isinstance(e, str) for e in ev) or not all(isinstance(r, int) for r in (*wr, *nr)):
            raise RecordError("verdict evidence must be strings and waiting_ranks / node_ranks integers")
        return cls(
            kind=vk,
            rank=_get(d, "rank", int, optional=True),
            node=_get(d, "node", int, optional=True),
            frame=_get(d, "frame", str, optional=True),
            t=float(_get(d, "t", _NUM)),
            evidence=tuple(ev),
            waiting_ranks=tuple(wr),
            node_ranks=tuple(nr),
        )
