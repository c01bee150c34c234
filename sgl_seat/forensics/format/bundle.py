"""Writing, verifying and reading forensic bundles (directories; ``archive.py`` packs them).

Writing is atomic: every file and then ``manifest.json`` go into a temporary directory beside the
destination, which is renamed into place, so a bundle under its own name is always complete. A disk that
fails mid-write (ENOSPC above all: ``$SGLSEAT_HOME`` full during a capture) leaves the partial directory as
``.incomplete-<id>`` with a marker (``INCOMPLETE.json``) saying which files were written and which are missing,
and the writer raises :class:`BundleWriteError` with the same facts, so the watchdog can report them; a crash
leaves a ``.tmp-*`` directory, cleaned up by a later write. A disk quota then removes the oldest bundles of that
directory (incomplete ones first).

Reading treats the bundle as hostile: the manifest is parsed strictly, every file must be a regular file
listed in the manifest with the listed size and sha256 (no links, no extra files), and each record file
decodes through ``records.py``'s strict ``from_json``. Nothing is executed, nothing is written. Any
problem is one :class:`BundleError` that names the file.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import io
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from sgl_seat import __version__
from sgl_seat.core.records import RECORD_SCHEMA_VERSION, EngineProcess, LogLine, MetricsPoint, StackSample
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.codec import (
    ProbeTable,
    decode_probe_records,
    decode_records,
    decode_stack_samples,
    dumps_line,
    loads_document,
)
from sgl_seat.forensics.format.manifest import BundleVersionError, FileEntry, Manifest
from sgl_seat.forensics.format.request_table import RequestTable, decode_request_table
from sgl_seat.forensics.format.scrub import scrub_json

__all__ = ["Bundle", "BundleWriteError", "failure_reason", "read_bundle", "rotate_bundles", "verify_bundle",
           "write_bundle"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Bytes read and hashed at a time when verifying (few, large chunks: each one the verifying thread takes the GIL).
_CHUNK = 1 << 23
#: A temporary directory older than this is a dead writer's leftover.
_STALE_TMP_S = 3600.0


# ---- writing -----------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if (not layout.FILE_NAME_RE.match(name) or name in (layout.MANIFEST, layout.INCOMPLETE)
            or ".." in name.split("/")):
        raise BundleError(f"bundle file name {name!r} is not a plain relative path",
                          fix="use names like 'stacks.jsonl' or 'logs/node0.log' (see forensics/README.md)")


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class BundleWriteError(BundleError):
    """A capture the disk would not take whole: what was written, what is missing, where the rest was left.

    ``path`` is the ``.incomplete-<id>`` directory (or the ``.tmp-*`` one, where even the rename failed; None when
    nothing could be created); ``marker`` says whether ``INCOMPLETE.json`` there lists the missing files (on a
    disk that is full it may not fit); ``reason`` is :func:`failure_reason` of the OS error.
    """

    def __init__(self, message: str, *, fix: str | None, path: Path | None, written: list[str],
                 missing: list[str], reason: str, marker: bool) -> None:
        super().__init__(message, fix=fix)
        self.path = path
        self.written = written
        self.missing = missing
        self.reason = reason
        self.marker = marker

    def to_json(self) -> dict[str, Any]:
        return {"path": None if self.path is None else str(self.path), "written": list(self.written),
                "missing": list(self.missing), "reason": self.reason, "marker": self.marker}


#: OS errors by what an operator does about them (the exporter's ``reason`` label, the snapshot's field).
_REASONS = {errno.ENOSPC: "disk-full", errno.EDQUOT: "disk-full", errno.EFBIG: "disk-full",
            errno.EROFS: "read-only", errno.EACCES: "permission", errno.EPERM: "permission"}
#: Every value :func:`failure_reason` returns (so a counter can start each at 0).
FAILURE_REASONS = ("disk-full", "read-only", "permission", "io", "other")


def failure_reason(exc: BaseException) -> str:
    """A short word for why a write failed: disk-full, read-only, permission, io (another OS error) or other."""
    if isinstance(exc, BundleWriteError):
        return exc.reason
    if isinstance(exc, OSError):
        return _REASONS.get(exc.errno or 0, "io")
    return "other"


def _marker(bundle_id: str, state: str, expected: list[str], written: list[str], exc: OSError | None) -> bytes:
    doc: dict[str, Any] = {
        "schema_version": layout.INCOMPLETE_SCHEMA_VERSION, "bundle_id": bundle_id, "state": state,
        "t": time.time(), "pid": os.getpid(), "written": written,
        "missing": [n for n in expected if n not in written],
    }
    if exc is not None:
        doc["error"] = exc.strerror or str(exc)
        doc["errno"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        doc["reason"] = failure_reason(exc)
    return (json.dumps(doc, sort_keys=True) + "\n").encode("utf-8")


def _leave_incomplete(tmp: Path, dest_root: Path, bundle_id: str, expected: list[str], written: list[str],
                      failed: str | None, exc: OSError) -> tuple[Path, bool]:
    """Keep what was written of a failed capture, renamed to ``.incomplete-<id>`` and marked; never raises.

    The file being written when the disk failed is removed (it is cut short, and its blocks are what the marker
    needs); the marker then replaces the one written before the first file, through a new file renamed over it,
    so a disk too full for the new one still leaves the old one, which lists every file as missing.
    """
    if failed is not None:
        with contextlib.suppress(OSError):
            (tmp / failed).unlink()
    where = tmp
    dest = dest_root / f"{layout.INCOMPLETE_PREFIX}{bundle_id}"
    with contextlib.suppress(OSError):
        if not dest.exists():
            os.rename(tmp, dest)
            where = dest
    marked = False
    try:
        new = where / f".{layout.INCOMPLETE}.new"
        with contextlib.suppress(FileNotFoundError):
            new.unlink()
        _write_file(new, _marker(bundle_id, "failed", expected, written, exc))
        os.replace(new, where / layout.INCOMPLETE)
        marked = True
    except OSError:
        with contextlib.suppress(OSError):
            (where / f".{layout.INCOMPLETE}.new").unlink()
        marked = (where / layout.INCOMPLETE).is_file()  # the first marker: every file listed as missing
    return where, marked


def write_bundle(dest_root: Path, bundle_id: str, manifest_fields: Mapping[str, Any], files: Mapping[str, bytes],
                 quota_mb: int) -> Path:
    """Write ``files`` and their manifest atomically as ``dest_root/<bundle_id>/``; then apply the quota.

    ``manifest_fields`` holds everything of the manifest but ``files``, ``schema_version`` and
    ``bundle_id`` (filled here): at least ``seat``, ``trigger`` (with ``t``), ``verdict`` (a
    ``Verdict.to_json()`` or None), ``nodes``, ``ranks``, ``time_range``; ``created``, ``versions``
    (sgl_seat's filled in) and ``record_schema_version`` default here. ``plan`` is scrubbed of secrets.
    The manifest is checked with the reader's own strict parser before anything is written, so a bundle
    that the writer produces is always one that ``replay`` accepts.

    An OS error while writing (a full disk) raises :class:`BundleWriteError` and leaves no ``<bundle_id>``: the
    part written stays as ``.incomplete-<bundle_id>`` with ``INCOMPLETE.json`` listing what is missing.
    """
    if not layout.BUNDLE_ID_RE.match(bundle_id):
        raise BundleError(f"bundle id {bundle_id!r} is not a plain name", fix="use letters, digits, '.', '_', '-'")
    for name in files:
        _check_name(name)
    doc: dict[str, Any] = dict(manifest_fields)
    doc["schema_version"] = layout.SCHEMA_VERSION
    doc["bundle_id"] = bundle_id
    doc.setdefault("created", time.time())
    doc.setdefault("record_schema_version", RECORD_SCHEMA_VERSION)
    doc["versions"] = {"sgl_seat": __version__, **dict(doc.get("versions") or {})}
    if doc.get("plan") is not None:
        doc["plan"] = scrub_json(doc["plan"])
    doc["files"] = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                    for name, data in sorted(files.items())}
    manifest = Manifest.from_json(doc)  # the reader's check, before the disk is touched
    try:
        manifest_bytes = (dumps_line(manifest.to_json()) + "\n").encode("utf-8")
    except ValueError as exc:
        raise BundleError(f"the manifest cannot be written as JSON: {exc}") from None

    final = dest_root / bundle_id
    expected = [*files, layout.MANIFEST]
    written: list[str] = []
    current: str | None = None
    tmp: Path | None = None
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
        if final.exists() or final.is_symlink():
            raise BundleError(f"bundle {final} already exists", fix="use a new bundle id")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{bundle_id}-", dir=dest_root))
        # The marker first (a few hundred bytes): a disk that fills up on the first file still says what is missing.
        current = layout.INCOMPLETE
        _write_file(tmp / layout.INCOMPLETE, _marker(bundle_id, "writing", expected, [], None))
        for name, data in files.items():
            current = name
            _write_file(tmp / name, data)
            written.append(name)
        current = layout.MANIFEST
        _write_file(tmp / layout.MANIFEST, manifest_bytes)
        written.append(layout.MANIFEST)
        current = None
        (tmp / layout.INCOMPLETE).unlink()
        for sub in {tmp / n for n in files if "/" in n}:
            _fsync_dir(sub.parent)
        _fsync_dir(tmp)
        os.rename(tmp, final)
        tmp = None
        _fsync_dir(dest_root)
    except OSError as exc:
        missing = [n for n in expected if n not in written]
        where, marked = (None, False) if tmp is None else _leave_incomplete(
            tmp, dest_root, bundle_id, expected, written, current, exc)
        tmp = None
        # What a failed capture keeps counts against the quota too: on a disk that stays full, every latched hang
        # would otherwise add another partial directory and take the space from the engine's logs and records.
        with contextlib.suppress(Exception):
            rotate_bundles(dest_root, quota_mb, keep=where)
        left = (f"; what was written is in {where}" + ("" if marked else " (no room for its INCOMPLETE.json)")
                if where is not None else "")
        raise BundleWriteError(
            f"could not write bundle {final}: {exc.strerror or exc}; {len(missing)} of {len(expected)} files "
            f"missing ({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}){left}",
            fix="free disk space, or lower bundles.quota_mb / watchdog.history_s, or point bundles.dir elsewhere",
            path=where, written=written, missing=missing, reason=failure_reason(exc), marker=marked) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    rotate_bundles(dest_root, quota_mb, keep=final)
    return final


@dataclass(frozen=True, slots=True)
class _OnDisk:
    path: Path
    created: float
    size: int
    complete: bool = True


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path, followlinks=False):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, n)).st_size
    return total


def _created(path: Path) -> float:
    """A bundle's creation time from its manifest, else its directory's mtime (never trusts it further)."""
    try:
        with open(path / layout.MANIFEST, "rb") as f:
            data = f.read(layout.MAX_MANIFEST_BYTES + 1)
        doc = loads_document(data, "manifest.json")
        c = doc.get("created") if isinstance(doc, dict) else None
        if isinstance(c, (int, float)) and not isinstance(c, bool):
            return float(c)
    except (OSError, BundleError):
        pass
    return path.stat().st_mtime


def rotate_bundles(dest_root: Path, quota_mb: int, *, keep: Path | None = None) -> list[Path]:
    """Delete the oldest bundles in ``dest_root`` until they fit in ``quota_mb``; never ``keep``.

    Also removes temporary directories that a dead writer left behind; ``.incomplete-*`` directories (captures a
    full disk cut short) count against the quota and go before any complete bundle. Returns what was deleted.
    A single bundle larger than the quota is kept (with a warning): losing the newest capture to
    make room for nothing would defeat the watchdog.
    """
    removed: list[Path] = []
    now = time.time()
    bundles: list[_OnDisk] = []
    try:
        entries = list(os.scandir(dest_root))
    except OSError:
        return removed
    for e in entries:
        p = Path(e.path)
        if not e.is_dir(follow_symlinks=False):
            continue
        if e.name.startswith(".tmp-"):
            with contextlib.suppress(OSError):
                if now - e.stat(follow_symlinks=False).st_mtime > _STALE_TMP_S:
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
            continue
        if e.name.startswith(layout.INCOMPLETE_PREFIX):  # a capture the disk did not take whole: first to go
            with contextlib.suppress(OSError):
                bundles.append(_OnDisk(p, e.stat(follow_symlinks=False).st_mtime, _dir_size(p), complete=False))
            continue
        if e.name.startswith(".") or not (p / layout.MANIFEST).is_file():
            continue
        bundles.append(_OnDisk(p, _created(p), _dir_size(p)))
    quota = quota_mb * 1024 * 1024
    total = sum(b.size for b in bundles)
    for b in sorted(bundles, key=lambda b: (b.complete, b.created, b.path.name)):
        if total <= quota:
            break
        if keep is not None and b.path == keep:
            continue
        shutil.rmtree(b.path, ignore_errors=True)
        removed.append(b.path)
        total -= b.size
        log.info("bundle quota %d MB: removed %s", quota_mb, b.path)
    if total > quota:
        log.warning("bundles in %s take %d MB, over the %d MB quota, with nothing older left to remove",
                    dest_root, total // (1024 * 1024), quota_mb)
    return removed


# ---- verifying ---------------------------------------------------------------------------------


def _damaged(path: Path, msg: str) -> BundleError:
    return BundleError(f"bundle {path}: {msg}",
                       fix="the bundle is damaged or was altered; capture it again or ask for a fresh copy")


def _open_member(root: Path, name: str) -> io.BufferedReader:
    """Open ``root/name`` for reading, refusing links at every level and anything but a regular file."""
    cur = root
    parts = name.split("/")
    for part in parts[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
        except OSError:
            raise _damaged(root, f"{name}: missing") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _damaged(root, f"{name}: {part} is not a plain directory")
    target = root / name
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise _damaged(root, f"{name}: missing") from None
    except OSError as exc:
        raise _damaged(root, f"{name}: cannot be opened ({exc.strerror}); links are refused") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _damaged(root, f"{name}: not a regular file")
    return os.fdopen(fd, "rb")


def _read_manifest(root: Path) -> Manifest:
    if not root.exists():
        raise BundleError(f"bundle {root} does not exist", fix="check the path (`sgl-seat bundle ls` lists bundles)")
    if not root.is_dir():
        raise BundleError(f"{root} is not a bundle directory",
                          fix="pass a bundle directory, or a .tar.zst made by `sgl-seat bundle pack`")
    with _open_member(root, layout.MANIFEST) as f:
        data = f.read(layout.MAX_MANIFEST_BYTES + 1)
    if len(data) > layout.MAX_MANIFEST_BYTES:
        raise _damaged(root, f"manifest.json is larger than {layout.MAX_MANIFEST_BYTES} bytes")
    return Manifest.from_json(loads_document(data, f"{root}/manifest.json"))


def _check_listing(root: Path, manifest: Manifest) -> None:
    """Every entry on disk is a directory or a listed regular file: no links, devices or extra files."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            seen += 1
            if seen > layout.MAX_FILES * 4:
                raise _damaged(root, "too many entries")
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                raise _damaged(root, f"{rel}: is a link (refused)")
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise _damaged(root, f"{rel}: not a regular file")
            if rel != layout.MANIFEST and rel not in manifest.files:
                raise _damaged(root, f"{rel}: not listed in manifest.json")


def _check_file(root: Path, name: str, ent: FileEntry, buf: bytearray) -> None:
    """Size and sha256 of one file against its manifest entry (read into ``buf``: no allocation per chunk; reading
    and hashing a chunk this size release the GIL, so a thread can do this beside decoding)."""
    h = hashlib.sha256()
    size = 0
    view = memoryview(buf)
    with _open_member(root, name) as f:
        while n := f.readinto(view):
            size += n
            if size > ent.size:
                raise _damaged(root, f"{name}: larger than the {ent.size} bytes the manifest lists")
            h.update(view[:n])
    if size != ent.size:
        raise _damaged(root, f"{name}: {size} bytes, the manifest lists {ent.size}")
    if h.hexdigest() != ent.sha256:
        raise _damaged(root, f"{name}: sha256 does not match the manifest")


def _check_files(root: Path, manifest: Manifest) -> BundleError | None:
    """The first file, in name order, whose size or digest is not the manifest's, as its error; None if none."""
    buf = bytearray(_CHUNK)
    try:
        for name, ent in sorted(manifest.files.items()):
            _check_file(root, name, ent, buf)
    except BundleError as exc:
        return exc
    return None


#: How long a reader waits at most for an amendment of the bundle it read to end (a capture's late files:
#: forensics/format/annotate.py renames them and then the manifest in, microseconds apart, under a marker).
_AMEND_WAIT_S = 1.0


def amending_marker(root: Path) -> Path:
    """The file beside a bundle that says it is being amended (annotate.add_late_files holds it)."""
    return root.parent / f".amending-{root.name}"


def _manifest_id(root: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(root / layout.MANIFEST)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _again(root: Path, before: tuple[int, int, int] | None) -> bool:
    """Whether a read that failed may have met an amendment (annotate.py) and should be tried once more: the
    manifest changed since the read began, or the amendment's marker is there (then its end is waited for)."""
    marker = amending_marker(root)
    deadline = time.monotonic() + _AMEND_WAIT_S
    amending = marker.exists()
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return amending or (before is not None and _manifest_id(root) != before)


def _once_more_if_amended(root: Path, read: Callable[[Path], T]) -> T:
    """``read(root)``, and once more where it failed on a bundle amended while it was read (:func:`_again`)."""
    before = _manifest_id(root)
    try:
        return read(root)
    except BundleVersionError:
        raise
    except BundleError:
        if not _again(root, before):
            raise
    return read(root)


def verify_bundle(path: Path) -> Manifest:
    """Check a bundle directory completely (manifest, listing, sizes, digests); return its manifest.
    A bundle amended while it was read (its late files) is read once more."""
    return _once_more_if_amended(Path(path), _verify)


def _verify(root: Path) -> Manifest:
    manifest = _read_manifest(root)
    _check_listing(root, manifest)
    err = _check_files(root, manifest)
    if err is not None:
        raise err
    return manifest


# ---- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bundle:
    """A verified bundle loaded into the watchdog's own record types."""

    path: Path
    manifest: Manifest
    stacks: list[StackSample] = field(default_factory=list)
    native_stacks: list[StackSample] = field(default_factory=list)
    probes: ProbeTable = field(default_factory=ProbeTable)
    metrics: list[MetricsPoint] = field(default_factory=list)
    processes: list[EngineProcess] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    requests: RequestTable = field(default_factory=RequestTable)
    env: dict[int, dict[str, str]] = field(default_factory=dict)
    log_text: dict[int, str] = field(default_factory=dict)
    gpu: dict[int, str] = field(default_factory=dict)
    process_state: dict[int, Any] = field(default_factory=dict)


def _load(root: Path, m: Manifest, name: str, decode: Callable[[IO[bytes], str], T], default: T) -> T:
    if name not in m.files:
        return default
    with _open_member(root, name) as f:
        return decode(f, name)


def _node_of(name: str, prefix: str, suffix: str) -> int | None:
    if name.startswith(prefix) and name.endswith(suffix):
        mid = name[len(prefix):len(name) - len(suffix)]
        if mid.isdigit() and len(mid) <= 6:
            return int(mid)
    return None


def _env_doc(f: IO[bytes], name: str) -> dict[int, dict[str, str]]:
    doc = loads_document(f.read(), name)
    out: dict[int, dict[str, str]] = {}
    if not isinstance(doc, dict):
        raise BundleError(f"{name}: expected an object node -> environment")
    for k, v in doc.items():
        if not k.isdigit() or len(k) > 6 or not isinstance(v, dict) or not all(
            isinstance(a, str) and isinstance(b, str) for a, b in v.items()
        ):
            raise BundleError(f"{name}: expected node numbers mapped to NAME -> value strings")
        out[int(k)] = dict(v)
    return out


def read_bundle(path: Path) -> Bundle:
    """Verify a bundle directory and decode every known file into typed records.

    The manifest and the listing are checked first; the files' sizes and digests are then checked on a second
    thread while this one decodes (hashing releases the GIL: with a second core free, the one-hour bundle's ~65 MB
    are hashed beside its decoding, not before it). Decoding is strict on its own, and nothing decoded is
    returned unless every file matched: where a file does not, its error is raised, as verifying first raised it,
    even where decoding failed too.
    """
    return _once_more_if_amended(Path(path), _read)


def _read(root: Path) -> Bundle:
    m = _read_manifest(root)
    _check_listing(root, m)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bundle-verify") as pool:
        verified = pool.submit(_check_files, root, m)
        try:
            with _collector_paused():
                bundle = _decode(root, m)
        except Exception:
            err = verified.result()
            if err is not None:
                raise err from None
            raise
        err = verified.result()
    if err is not None:
        raise err
    return bundle


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk decode, then back as it was.

    Decoding a one-hour bundle allocates some 100,000 container objects (samples, their thread stacks, request
    lines as dicts) and makes no reference cycles; the collector's passes over them, triggered every few hundred
    allocations, found nothing and cost ~0.1 s of its ~0.8 s read."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _decode(root: Path, m: Manifest) -> Bundle:
    """Every known file of a bundle whose manifest and listing were checked, decoded into typed records."""
    log_text: dict[int, str] = {}
    gpu: dict[int, str] = {}
    pstate: dict[int, Any] = {}
    for name in m.files:
        node = _node_of(name, "logs/node", ".log")
        if node is not None:
            with _open_member(root, name) as f:
                log_text[node] = f.read().decode("utf-8", "replace")
        node = _node_of(name, "gpu/node", ".txt")
        if node is not None:
            with _open_member(root, name) as f:
                gpu[node] = f.read().decode("utf-8", "replace")
        node = _node_of(name, "processes/node", ".json")
        if node is not None:
            with _open_member(root, name) as f:
                pstate[node] = loads_document(f.read(), name)
    return Bundle(
        path=root,
        manifest=m,
        stacks=_load(root, m, layout.STACKS, decode_stack_samples, []),
        native_stacks=_load(root, m, layout.NATIVE_STACKS, decode_stack_samples, []),
        probes=_load(root, m, layout.PROBE, decode_probe_records, ProbeTable()),
        metrics=_load(root, m, layout.METRICS, lambda f, n: decode_records(f, MetricsPoint.from_json, n), []),
        processes=_load(root, m, layout.PROCESSES, lambda f, n: decode_records(f, EngineProcess.from_json, n), []),
        logs=_load(root, m, layout.LOGS, lambda f, n: decode_records(f, LogLine.from_json, n), []),
        requests=_load(root, m, layout.REQUESTS, decode_request_table, RequestTable()),
        env=_load(root, m, layout.ENV, _env_doc, {}),
        log_text=log_text,
        gpu=gpu,
        process_state=pstate,
    )
