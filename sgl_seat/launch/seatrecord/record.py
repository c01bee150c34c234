"""The local seat record: ``$SGLSEAT_HOME/seats/<name>.json``, a cache of what Ray knows.

``up`` writes it as it goes (so an interrupted ``up`` or a crashed driver still leaves enough
behind for ``down``), ``status`` reconciles it with Ray and the engines and writes it back, and
``down`` removes it once it has verified that nothing of the seat remains. The record can drift
from reality (a node can die while nobody looks); it is never the authority, only the address
book and the last thing seen.

Versions: schema 1 (first version; ``bundles_dir`` added later, optional: records without it read the
seat's spec for it; ``capture_failures`` added later, optional: empty in records without it). Schema 2 (issue
26): ``on_hang``, ``remediation_policy`` and ``remediations`` (the seat's healing by policy), and the states
REMEDIATING and REMEDIATION-EXHAUSTED, which a schema-1 reader would take for a damaged record. A schema-1 record
still loads (``on_hang: capture``, the spec's budget or the defaults, no history) and is written back as schema 2.
Schema 3 (issue 47): ``spec``, the spec as `up` resolved it (:meth:`SeatSpec.to_json`, its ports moved by
``--port-base``), which sidecars, the supervisor, `status` and healing read instead of the seat file, so an edit of
the file while the seat runs changes nothing of it. A record without it (schema 1 or 2, from an older sgl-seat) still
loads: :meth:`SeatRecord.seat_spec` then reads the file again, as it is now, with a warning saying so; it is written
back as schema 3 without a spec (it cannot know what the file held at `up`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sgl_seat.core.records import RecordError
from sgl_seat.core.remediation import Policy, RemediationRecord
from sgl_seat.errors import SeatError, SeatStateError, SpecError, UsageError
from sgl_seat.forensics.format.layout import seat_bundles_dir
from sgl_seat.launch.seatrecord.home import home_error, read_json, seats_dir, write_json_atomic
from sgl_seat.launch.seatrecord.state import SeatState, parse_state, transition
from sgl_seat.spec import SeatSpec, load_spec

RECORD_SCHEMA_VERSION = 3
#: The versions this code reads (an older one is upgraded in memory: its new fields take their defaults).
READABLE_RECORD_VERSIONS = (1, 2, 3)

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class RankRecord:
    """One scheduler rank as last seen: found by its process title in the node's engine group."""

    tp_rank: int
    ep_rank: int
    title: str
    pid: int | None = None
    alive: bool = False
    #: The process's state as the OS reports it (psutil: running, sleeping, stopped, ...); "gone" once it is
    #: not there. A stopped (SIGSTOP) scheduler is alive but serves nothing.
    state: str | None = None


@dataclass(kw_only=True, slots=True)
class NodeRecord:
    """One node of the seat: its agent, its engine process group and its log."""

    node_rank: int
    agent: str
    ip: str | None = None
    #: The ``cluster.hosts`` entry Ray's placement put this node on (None without ``cluster.hosts``).
    host: str | None = None
    node_id: str | None = None
    host_id: str | None = None
    agent_pid: int | None = None
    python: str | None = None
    gpu_ids: list[str] = field(default_factory=list)
    log_path: str | None = None
    engine_pid: int | None = None
    pgid: int | None = None
    alive: bool | None = None
    returncode: int | None = None
    pids: list[int] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[RankRecord] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeRecord:
        ranks = [RankRecord(**r) for r in d.get("ranks", [])]
        return cls(**{**d, "ranks": ranks})


@dataclass(kw_only=True, slots=True)
class SeatRecord:
    """Everything needed to find, check and take down a seat from any process on this host."""

    name: str
    state: SeatState
    engine: str
    draft: bool
    cluster_address: str
    namespace: str
    pg_name: str
    reason: str | None = None
    log_tail: list[str] = field(default_factory=list)
    #: The seat file `up` read (display, and where model.config paths are relative to); never read again, except
    #: for a record without ``spec`` (:meth:`seat_spec`).
    spec_source: str | None = None
    #: The spec as `up` resolved it (:meth:`SeatSpec.to_json`): what everything after `up` reads; None in records
    #: written before schema 3.
    spec: dict[str, Any] | None = None
    gcs_address: str | None = None
    local_cluster: bool = False
    token_env: str | None = None
    endpoint: str | None = None
    plan: dict[str, Any] | None = None
    nodes: list[NodeRecord] = field(default_factory=list)
    kv_predicted: int | None = None
    kv_actual: int | None = None
    busy_pid: int | None = None
    busy_host: str | None = None
    no_watchdog: bool = False
    #: Where the seat's watchdog writes its bundles, as `up` resolved it (``forensics.layout.seat_bundles_dir``).
    bundles_dir: str | None = None
    #: While HUNG: the bundle the watchdog captured for the hang it has latched on (id, verdict line).
    hang_bundle: str | None = None
    hang_verdict: str | None = None
    #: The watchdog's captures that left no complete bundle (a full or read-only disk), as `status` last read
    #: them from the sidecars: {node, bundle_id, reason, error, path, missing, t}, newest last.
    capture_failures: list[dict[str, Any]] = field(default_factory=list)
    #: What the supervisor does after a hang's bundle (``watchdog.on_hang``, or ``up --on-hang``).
    on_hang: str = "capture"
    #: The effective policy `up` brought the seat up with (:meth:`Policy.to_json`); None in schema-1 records.
    remediation_policy: dict[str, Any] | None = None
    #: Every decision the supervisor acted on or refused, oldest first (:meth:`RemediationRecord.to_json`).
    remediations: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    schema_version: int = RECORD_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, path: str = "<record>") -> SeatRecord:
        version = d.get("schema_version")
        if version not in READABLE_RECORD_VERSIONS or isinstance(version, bool):
            raise SeatStateError(
                f"{path}: seat record schema_version {version!r} is not one of "
                f"{', '.join(map(str, READABLE_RECORD_VERSIONS))}",
                fix="use the sgl-seat version that wrote it, or remove the file once the seat is down",
            )
        try:
            nodes = [NodeRecord.from_dict(n) for n in d.get("nodes", [])]
            rec = cls(**{**d, "state": parse_state(d["state"]), "nodes": nodes,
                         "schema_version": RECORD_SCHEMA_VERSION})
            rec.policy()  # a damaged policy or history is found on load, not when the supervisor needs it
            rec.remediation_history()
            if rec.spec is not None:  # as is a damaged spec
                rec.seat_spec()
            return rec
        except (TypeError, KeyError) as exc:
            raise SeatStateError(f"{path}: damaged seat record ({exc})",
                                 fix="take the seat down by hand and remove the file") from None
        except RecordError as exc:
            raise SeatStateError(f"{path}: damaged seat record ({exc})",
                                 fix="fix or remove the `remediation_policy` / `remediations` entry") from None
        except SpecError as exc:
            raise SeatStateError(f"{path}: damaged seat record (its spec: {exc.message})",
                                 fix="take the seat down by hand and remove the file") from None

    def seat_spec(self) -> SeatSpec | None:
        """The seat's spec as `up` resolved it, rebuilt from the record; None for a seat recorded without a spec file.

        A record written before the record kept the spec (schema 1 or 2) gets its spec file read again, as it is
        now, with a warning: what the file held at `up` is not known. Its load errors are the caller's."""
        if self.spec is not None:
            return SeatSpec.from_json(self.spec, source=self.spec_source)
        if not self.spec_source:
            return None
        log.warning("seat %r's record holds no spec (written by an older sgl-seat): reading %s again, as it is now, "
                    "which may differ from what `up` read; bring the seat up again to record it", self.name,
                    self.spec_source)
        return load_spec(self.spec_source)

    def policy(self) -> Policy:
        """The seat's effective on_hang policy: as `up` recorded it; for a schema-1 record, ``on_hang`` with the
        spec's budget if the spec still loads, else the defaults."""
        if self.remediation_policy is not None:
            return Policy.from_json({**self.remediation_policy, "on_hang": self.on_hang})
        wd = None
        with contextlib.suppress(SeatError, OSError):  # a schema-1 record's spec moved or no longer parses
            spec = self.seat_spec()
            wd = spec.watchdog if spec is not None else None
        return Policy.of(wd, self.on_hang) if wd is not None else Policy(on_hang=self.on_hang)

    def remediation_history(self) -> list[RemediationRecord]:
        """The remediations, oldest first, as typed records (what :func:`sgl_seat.core.remediation.decide` takes)."""
        return [RemediationRecord.from_json(r) for r in self.remediations]

    def add_remediation(self, r: RemediationRecord) -> None:
        """Append a new remediation (the supervisor: when it decides)."""
        self.remediations.append(r.to_json())
        self.updated_at = time.time()

    def update_remediation(self, r: RemediationRecord) -> None:
        """Replace the latest remediation with ``r`` (the supervisor: engines stopped, serving again, failed)."""
        if not self.remediations:
            raise SeatStateError(f"seat {self.name!r} has no remediation to update",
                                 fix="record it first with add_remediation")
        self.remediations[-1] = r.to_json()
        self.updated_at = time.time()

    def set_state(self, state: SeatState, reason: str | None = None) -> None:
        """Change state along a documented transition (:data:`sgl_seat.launch.seatrecord.state.TRANSITIONS`)."""
        self.state = transition(self.state, state)
        if reason is not None:
            self.reason = reason
        self.updated_at = time.time()


def record_path(name: str) -> Path:
    return seats_dir() / f"{name}.json"


def load_record(name: str) -> SeatRecord:
    path = record_path(name)
    try:
        doc = read_json(path)
    except FileNotFoundError:
        raise SeatStateError(f"no seat named {name!r} is recorded in {seats_dir()}",
                             fix=f"recorded seats: {list_names() or 'none'}; `sgl-seat up` starts one") from None
    except (OSError, ValueError) as exc:
        raise SeatStateError(f"{path}: unreadable seat record ({exc})", fix="remove the file") from None
    if not isinstance(doc, dict):
        raise SeatStateError(f"{path}: a seat record must be a JSON object", fix="remove the file")
    return SeatRecord.from_dict(doc, path=str(path))


@contextlib.contextmanager
def record_lock(name: str) -> Iterator[None]:
    """Hold seat ``name``'s record lock (``flock`` on ``seats/<name>.lock``) around a read-modify-write of its
    record: the seat's supervisor and `status` both write it, and neither may put back a copy older than the other's.
    A home that takes no lock file (read-only) gives no lock: then nobody can write the record either."""
    path = seats_dir() / f"{name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_record(rec: SeatRecord) -> None:
    """Write the record; a home that takes no write (full, read-only) is a :class:`HomeError` saying so."""
    rec.updated_at = time.time()
    path = record_path(rec.name)
    try:
        write_json_atomic(path, rec.to_dict())
    except OSError as exc:
        raise home_error(path.parent.parent, exc, f"seat {rec.name!r}'s record ({path}) could not be saved") \
            from None


def claim_record(rec: SeatRecord) -> None:
    """Create the record only if none exists: two `up`s of one seat cannot both proceed."""
    path = record_path(rec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        old = load_record(rec.name)
        raise SeatStateError(
            f"seat {rec.name!r} is already recorded as {old.state.value}"
            + (f" at {old.endpoint}" if old.endpoint else "")
            + "; a second `up` is refused",
            fix=f"run `sgl-seat down {rec.name}` first (or `sgl-seat status {rec.name}` to see it)",
        ) from None
    os.close(fd)
    save_record(rec)


def remove_record(name: str) -> None:
    path = record_path(name)
    with contextlib.suppress(OSError):
        (seats_dir() / f"{name}.lock").unlink()
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise home_error(path.parent.parent, exc, f"seat {name!r}'s record ({path}) could not be removed") from None


def list_names() -> list[str]:
    d = seats_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.json") if not p.name.startswith("."))


def bundles_dir_of(rec: SeatRecord) -> Path:
    """Where seat ``rec``'s bundles are: as `up` recorded it; for a record without it, from the seat's spec
    (``bundles.dir``) if it still loads, else the default place."""
    if rec.bundles_dir:
        return Path(rec.bundles_dir)
    configured = None
    with contextlib.suppress(SeatError, OSError):  # an old record's spec moved or no longer parses
        spec = rec.seat_spec()
        configured = spec.bundles.dir if spec is not None else None
    return seat_bundles_dir(rec.name, configured)


def bundles_dir_for(name: str) -> Path:
    """Where seat ``name``'s bundles are: its record's directory when it is recorded here, else the default."""
    if not record_path(name).is_file():
        return seat_bundles_dir(name)
    return bundles_dir_of(load_record(name))


def recorded_bundle_dirs() -> list[Path]:
    """The bundle directory of every seat recorded here (for commands that look a bundle up by id)."""
    out = []
    for name in list_names():
        with contextlib.suppress(SeatError):  # a damaged record is `status`'s business, not a lookup's
            out.append(bundles_dir_of(load_record(name)))
    return out


def resolve_name(name: str | None) -> str:
    """NAME if given, else the only recorded seat; anything else is a usage error listing them."""
    if name:
        return name
    names = list_names()
    if len(names) == 1:
        return names[0]
    if not names:
        raise UsageError(f"no seat is recorded in {seats_dir()}", fix="start one with `sgl-seat up`")
    raise UsageError(f"several seats are recorded: {', '.join(names)}", fix="name one, e.g. `sgl-seat status NAME`")
