"""The bundle manifest (``manifest.json``, schema_version 1): what was captured, why, and each file's digest.

The manifest is what makes a bundle self-describing (seat, plan, trigger, verdict, who and what ran)
and verifiable (every file's size and sha256). ``forensics/bundle.schema.json`` is the same contract as
a JSON Schema for other tools; :meth:`Manifest.from_json` is the reader's strict check, since a bundle
is untrusted input. Unknown top-level keys are kept in ``extra`` and ignored: a later minor version may
add fields, only a new major (``schema_version``) may change these.

Version notes:
- 1: first version (this module).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sgl_seat.core.records import RecordError, Verdict
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.layout import BUNDLE_ID_RE, FILE_NAME_RE, MAX_FILE_BYTES, MAX_FILES, SCHEMA_VERSION

__all__ = ["BundleVersionError", "FileEntry", "Manifest"]

_SEAT_RE = BUNDLE_ID_RE
_MAX_STR = 4096


class BundleVersionError(BundleError):
    """A bundle whose ``schema_version`` major this sgl-seat does not read."""



def _verdict(d: dict[str, Any], key: str) -> Verdict | None:
    """``d[key]`` as a Verdict (None when absent or null); a malformed one is a bad manifest."""
    if d.get(key) is None:
        return None
    try:
        return Verdict.from_json(d[key])
    except (RecordError, TypeError, ValueError) as exc:
        raise _bad(key, str(exc)) from None

@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of the bundle as the writer saw it."""

    size: int
    sha256: str


def _bad(field_name: str, what: str) -> BundleError:
    return BundleError(f"manifest.json: field {field_name!r}: {what}",
                       fix="the bundle is damaged or was not written by sgl-seat; capture it again or ask for "
                           "a fresh copy")


def _num(d: dict[str, Any], key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(f"{where}{key}", "expected a finite number")
    return float(v)


def _int(v: Any, name: str) -> int:
    if type(v) is not int:
        raise _bad(name, "expected an integer")
    return v


def _str(v: Any, name: str, *, optional: bool = False, limit: int = _MAX_STR) -> str | None:
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise _bad(name, f"expected a string of at most {limit} characters")
    return v


def _int_list(v: Any, name: str) -> tuple[int, ...]:
    if not isinstance(v, list) or len(v) > 65_536 or not all(type(x) is int and x >= 0 for x in v):
        raise _bad(name, "expected a list of non-negative integers")
    return tuple(v)


def _scalars(v: Any, name: str, *, optional: bool = True) -> dict[str, Any]:
    """A flat object of short scalars (trigger, versions, thresholds)."""
    if v is None and optional:
        return {}
    if not isinstance(v, dict) or len(v) > 256:
        raise _bad(name, "expected an object of at most 256 fields")
    for k, x in v.items():
        if len(k) > 128 or not (x is None or isinstance(x, (bool, int, float)) or
                                (isinstance(x, str) and len(x) <= _MAX_STR)):
            raise _bad(f"{name}.{k}", "expected a number, boolean, null or short string")
        if isinstance(x, float) and not math.isfinite(x):
            raise _bad(f"{name}.{k}", "expected a finite number")
    return dict(v)


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed, checked ``manifest.json``."""

    schema_version: int
    bundle_id: str
    seat: str
    created: float
    trigger: dict[str, Any]
    verdict: Verdict | None
    nodes: tuple[int, ...]
    ranks: tuple[int, ...]
    rank_nodes: dict[int, int]
    versions: dict[str, Any]
    time_start: float
    time_end: float
    files: dict[str, FileEntry]
    plan: dict[str, Any] | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    redaction: dict[str, Any] = field(default_factory=dict)
    capture: tuple[dict[str, Any], ...] = ()
    record_schema_version: int = 1
    #: The triggering sidecar's own live verdict (its node's view, before the merge); None for a manual
    #: capture or a bundle written before this field existed. ``verdict`` is recomputed over the merged records.
    live_verdict: Verdict | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def trigger_t(self) -> float:
        t = self.trigger.get("t")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else self.time_end

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema_version": self.schema_version,
            "bundle_id": self.bundle_id,
            "seat": self.seat,
            "created": self.created,
            "trigger": dict(self.trigger),
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            "nodes": list(self.nodes),
            "ranks": list(self.ranks),
            "rank_nodes": {str(r): n for r, n in sorted(self.rank_nodes.items())},
            "versions": dict(self.versions),
            "time_range": {"start": self.time_start, "end": self.time_end},
            "plan": self.plan,
            "thresholds": dict(self.thresholds),
            "redaction": dict(self.redaction),
            "capture": [dict(c) for c in self.capture],
            "record_schema_version": self.record_schema_version,
            "files": {n: {"size": f.size, "sha256": f.sha256} for n, f in sorted(self.files.items())},
        }
        if self.live_verdict is not None:  # optional (1.x): absent in bundles written before it existed
            doc["live_verdict"] = self.live_verdict.to_json()
        for k, v in self.extra.items():
            doc.setdefault(k, v)
        return doc

    @classmethod
    def from_json(cls, d: Any) -> Manifest:
        if not isinstance(d, dict):
            raise _bad("(top)", "expected a JSON object")
        sv = d.get("schema_version")
        if type(sv) is not int:
            raise _bad("schema_version", "expected an integer")
        if sv != SCHEMA_VERSION:
            raise BundleVersionError(
                f"manifest.json: schema_version {sv} is not readable by this sgl-seat (it reads {SCHEMA_VERSION})",
                fix="use the sgl-seat version that wrote the bundle, or upgrade sgl-seat")
        bundle_id = _str(d.get("bundle_id"), "bundle_id", limit=128)
        if bundle_id is None or not BUNDLE_ID_RE.match(bundle_id):
            raise _bad("bundle_id", "expected letters, digits, '.', '_' or '-'")
        seat = _str(d.get("seat"), "seat", limit=128)
        if seat is None or not _SEAT_RE.match(seat):
            raise _bad("seat", "expected a seat name")
        created = _num(d, "created", "")
        trig = _scalars(d.get("trigger"), "trigger", optional=False)
        if "t" in trig:
            _num(trig, "t", "trigger.")
        verdict, live_verdict = _verdict(d, "verdict"), _verdict(d, "live_verdict")
        tr = d.get("time_range")
        if not isinstance(tr, dict):
            raise _bad("time_range", "expected an object with start and end")
        start, end = _num(tr, "start", "time_range."), _num(tr, "end", "time_range.")
        if end < start:
            raise _bad("time_range", "end is before start")
        rank_nodes_raw = d.get("rank_nodes") or {}
        if not isinstance(rank_nodes_raw, dict) or len(rank_nodes_raw) > 65_536:
            raise _bad("rank_nodes", "expected an object rank -> node")
        rank_nodes: dict[int, int] = {}
        for k, v in rank_nodes_raw.items():
            if not k.isdigit() or len(k) > 9 or type(v) is not int or v < 0:
                raise _bad("rank_nodes", "expected rank numbers mapped to node numbers")
            rank_nodes[int(k)] = v
        files_raw = d.get("files")
        if not isinstance(files_raw, dict) or len(files_raw) > MAX_FILES:
            raise _bad("files", f"expected an object of at most {MAX_FILES} files")
        files: dict[str, FileEntry] = {}
        for name, ent in files_raw.items():
            if not FILE_NAME_RE.match(name) or name == "manifest.json" or ".." in name.split("/"):
                raise _bad("files", f"file name {name[:80]!r} is not a plain relative path")
            if not isinstance(ent, dict):
                raise _bad(f"files.{name}", "expected {size, sha256}")
            size, sha = ent.get("size"), ent.get("sha256")
            if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
                raise _bad(f"files.{name}.size", f"expected an integer from 0 to {MAX_FILE_BYTES}")
            if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
                raise _bad(f"files.{name}.sha256", "expected 64 lower-case hex digits")
            files[name] = FileEntry(size, sha)
        plan = d.get("plan")
        if plan is not None and not isinstance(plan, dict):
            raise _bad("plan", "expected an object or null")
        capture = d.get("capture") or []
        if not isinstance(capture, list) or len(capture) > 4096:
            raise _bad("capture", "expected a list of capture step results")
        cap = tuple(_scalars(c, "capture[]", optional=False) for c in capture)
        rsv = d.get("record_schema_version", 1)
        known = {"schema_version", "bundle_id", "seat", "created", "trigger", "verdict", "nodes", "ranks",
                 "rank_nodes", "versions", "time_range", "plan", "thresholds", "redaction", "capture",
                 "record_schema_version", "files", "live_verdict"}
        return cls(
            schema_version=sv,
            bundle_id=bundle_id,
            seat=seat,
            created=created,
            trigger=trig,
            verdict=verdict,
            live_verdict=live_verdict,
            nodes=_int_list(d.get("nodes"), "nodes"),
            ranks=_int_list(d.get("ranks"), "ranks"),
            rank_nodes=rank_nodes,
            versions=_scalars(d.get("versions"), "versions"),
            time_start=start,
            time_end=end,
            files=files,
            plan=plan,
            thresholds=_scalars(d.get("thresholds"), "thresholds"),
            redaction=_scalars(d.get("redaction"), "redaction"),
            capture=cap,
            record_schema_version=_int(rsv, "record_schema_version"),
            extra={k: v for k, v in d.items() if k not in known},
        )
