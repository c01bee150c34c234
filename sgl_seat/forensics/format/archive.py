"""``.tar.zst`` archives of bundles: deterministic packing and a hostile-input-proof unpacker.

A bundle is mailed, attached to tickets and downloaded from strangers, so unpacking assumes the archive
was crafted: tarfile's own extraction is never used. Each member is checked (a plain relative name under
one top directory, a regular file, listed in the manifest, no larger than the manifest says) and written
by this module into a fresh temporary directory inside the target, which is verified in full and only
then renamed into place. Links, devices, absolute paths and ``..`` are refused; the decompressed stream is
capped so neither a zstd bomb nor an oversized tar header can exhaust memory or disk. Any problem is one
BundleError and leaves nothing behind.

Why an absolute cap on top of the manifest's sizes: the manifest is the stranger's own claim. An archive of
130 KB whose manifest lists 3 GB of zeros is consistent with itself and used to unpack all of it. So the claim
(the manifest's bytes plus every listed file's size) is checked against ``max_unpacked_bytes`` (2 GiB unless the
caller raises it) right after the manifest is parsed, before a byte is written; only then does the decompressed
stream's own cap grow by the claim. A stream that runs past its claim stops there, and what was written of it is
removed with the rest (:class:`ArchiveLimitError` for the first case, :class:`BundleError` for the second).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import IO, Any

import zstandard

from sgl_seat.errors import ArchiveLimitError, BundleError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.bundle import verify_bundle
from sgl_seat.forensics.format.codec import loads_document
from sgl_seat.forensics.format.manifest import Manifest

__all__ = ["ARCHIVE_SUFFIX", "DEFAULT_MAX_UNPACKED_BYTES", "is_archive", "pack_bundle", "unpack_bundle"]

ARCHIVE_SUFFIX = ".tar.zst"
_CHUNK = 1 << 20
#: Bytes of tar headers and padding allowed per member on top of the manifest's sizes.
_HEADER_ALLOWANCE = 64 * 1024
#: zstd window limit: bounds the decompressor's memory whatever the frame header claims.
_MAX_WINDOW = 1 << 27
#: What an archive may unpack to unless the caller raises it: a bundle holds minutes of history (tens of MB);
#: 2 GiB leaves room for a long one and stops an archive from filling the disk of whoever opens it.
DEFAULT_MAX_UNPACKED_BYTES = 2 << 30


def is_archive(path: Path) -> bool:
    return path.name.endswith((ARCHIVE_SUFFIX, ".tzst")) and not path.is_dir()


def _hostile(archive: Path, msg: str) -> BundleError:
    return BundleError(f"archive {archive}: {msg}",
                       fix="the archive is damaged or was not made by `sgl-seat bundle pack`; refusing to unpack it")


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / (1 << 30):.2f} GiB)"


def _too_large(archive: Path, claimed: int, cap: int) -> ArchiveLimitError:
    return ArchiveLimitError(
        f"archive {archive}: its manifest claims it unpacks to {_size(claimed)}, over the cap of {_size(cap)}; "
        "nothing was written",
        fix=f"if you trust where it came from, allow it with --max-unpacked-bytes {claimed} (or more)")


def pack_bundle(src: Path, dest: Path | None = None, *, level: int = 10) -> Path:
    """Verify ``src`` and write it as ``<dest or src>.tar.zst`` (manifest first, fixed metadata)."""
    src = Path(src)
    manifest = verify_bundle(src)
    out = Path(dest) if dest is not None else src.with_name(src.name + ARCHIVE_SUFFIX)
    if out.exists():
        raise BundleError(f"{out} already exists", fix="remove it or pass another destination")
    names = [layout.MANIFEST, *sorted(manifest.files)]
    mtime = int(manifest.created)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            cctx = zstandard.ZstdCompressor(level=level)
            with cctx.stream_writer(raw, closefd=False) as zw, tarfile.open(fileobj=zw, mode="w|",
                                                                           format=tarfile.PAX_FORMAT) as tar:
                for name in names:
                    p = src / name
                    info = tarfile.TarInfo(f"{manifest.bundle_id}/{name}")
                    info.size = p.stat().st_size
                    info.mtime = mtime
                    info.mode = 0o644
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(p, "rb") as fh:
                        tar.addfile(info, fh)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BundleError(f"could not write {out}: {exc.strerror or exc}", fix="free disk space") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


class _CappedReader(io.RawIOBase):
    """A read-only stream that refuses to yield more than ``cap`` bytes in total (the cap can grow)."""

    def __init__(self, inner: IO[bytes], cap: int, archive: Path) -> None:
        self.inner = inner
        self.cap = cap
        self.seen = 0
        self.archive = archive

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b)
        want = len(view)
        data = self.inner.read(want)
        self.seen += len(data)
        if self.seen > self.cap:
            raise _hostile(self.archive, "decompresses to more than its manifest accounts for")
        view[: len(data)] = data
        return len(data)


def _member_name(archive: Path, m: tarfile.TarInfo, top: str | None) -> tuple[str, str]:
    name = m.name
    if "\\" in name or "\x00" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise _hostile(archive, f"member {name[:120]!r} has an absolute or odd path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise _hostile(archive, f"member {name[:120]!r} climbs out with '..'")
    if not parts:
        raise _hostile(archive, "a member has an empty name")
    head, rest = parts[0], "/".join(parts[1:])
    if not layout.BUNDLE_ID_RE.match(head):
        raise _hostile(archive, f"member {name[:120]!r} is not under a bundle directory")
    if top is not None and head != top:
        raise _hostile(archive, f"member {name[:120]!r} is outside the bundle directory {top!r}")
    return head, rest


def _copy_member(archive: Path, src: IO[bytes], dest: Path, size: int, sha: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    h = hashlib.sha256()
    got = 0
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = src.read(min(_CHUNK, size - got + 1))
            if not chunk:
                break
            got += len(chunk)
            if got > size:
                raise _hostile(archive, f"{dest.name}: larger than the manifest says")
            h.update(chunk)
            out.write(chunk)
    if got != size or h.hexdigest() != sha:
        raise _hostile(archive, f"{dest.name}: does not match its manifest entry")


def unpack_bundle(archive: Path, into: Path, *, max_unpacked_bytes: int | None = None) -> Path:
    """Unpack a bundle archive into ``into/<bundle_id>/`` safely; return that directory (verified).

    ``max_unpacked_bytes`` (default :data:`DEFAULT_MAX_UNPACKED_BYTES`) caps what is written, whatever the
    manifest claims: an archive claiming more is refused with :class:`ArchiveLimitError` before a byte is written.
    """
    cap = DEFAULT_MAX_UNPACKED_BYTES if max_unpacked_bytes is None else max_unpacked_bytes
    if cap < 1:
        raise BundleError(f"max_unpacked_bytes must be positive, got {cap}", fix="pass a byte count of 1 or more")
    archive = Path(archive)
    into = Path(into)
    if not archive.is_file():
        raise BundleError(f"{archive} is not a file", fix="pass a .tar.zst made by `sgl-seat bundle pack`")
    into.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".unpack-", dir=into))
    try:
        top = _unpack_into(archive, work, cap)
        final = into / top
        if final.exists() or final.is_symlink():
            raise BundleError(f"{final} already exists", fix="remove it or unpack into another directory")
        verify_bundle(work / top)
        os.rename(work / top, final)
        return final
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise _hostile(archive, f"not a readable .tar.zst ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise BundleError(f"could not unpack {archive} into {into}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _unpack_into(archive: Path, work: Path, cap: int) -> str:
    dctx = zstandard.ZstdDecompressor(max_window_size=_MAX_WINDOW)
    with open(archive, "rb") as raw, dctx.stream_reader(raw, read_across_frames=True) as zr:
        capped = _CappedReader(zr, layout.MAX_MANIFEST_BYTES + _HEADER_ALLOWANCE * 4, archive)
        stream = io.BufferedReader(capped, buffer_size=_CHUNK)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            top: str | None = None
            manifest: Manifest | None = None
            written: set[str] = set()
            count = 0
            for m in tar:
                count += 1
                if count > layout.MAX_FILES + 1:
                    raise _hostile(archive, "too many members")
                head, rest = _member_name(archive, m, top)
                top = head
                if m.isdir() and manifest is None and not rest:
                    continue
                if not m.isreg() or m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    kind = ("a link" if m.issym() or m.islnk() else "a device" if m.ischr() or m.isblk()
                            else "a directory" if m.isdir() else "not a regular file")
                    raise _hostile(archive, f"member {m.name[:120]!r} is {kind} (refused)")
                if manifest is None:
                    if rest != layout.MANIFEST:
                        raise _hostile(archive, "the first file is not manifest.json")
                    if m.size > layout.MAX_MANIFEST_BYTES:
                        raise _hostile(archive, "manifest.json is too large")
                    fh = tar.extractfile(m)
                    if fh is None:
                        raise _hostile(archive, "manifest.json cannot be read")
                    data = fh.read(m.size + 1)
                    if len(data) != m.size:
                        raise _hostile(archive, "manifest.json is truncated")
                    manifest = Manifest.from_json(loads_document(data, f"{archive}:manifest.json"))
                    if manifest.bundle_id != head:
                        raise _hostile(archive, f"directory {head!r} does not match bundle_id {manifest.bundle_id!r}")
                    claimed = len(data) + manifest.total_size
                    if claimed > cap:  # before the first byte is written (the manifest's own included)
                        raise _too_large(archive, claimed, cap)
                    dest = work / head / layout.MANIFEST
                    dest.parent.mkdir(parents=True)
                    with open(dest, "xb") as out:
                        out.write(data)
                    capped.cap += manifest.total_size + _HEADER_ALLOWANCE * (len(manifest.files) + 2)
                    continue
                ent = manifest.files.get(rest)
                if ent is None:
                    raise _hostile(archive, f"member {rest[:120]!r} is not listed in the manifest")
                if rest in written:
                    raise _hostile(archive, f"member {rest[:120]!r} appears twice")
                if m.size != ent.size:
                    raise _hostile(archive, f"member {rest!r} is {m.size} bytes, the manifest lists {ent.size}")
                fh = tar.extractfile(m)
                if fh is None:
                    raise _hostile(archive, f"member {rest!r} cannot be read")
                _copy_member(archive, fh, work / head / rest, ent.size, ent.sha256)
                written.add(rest)
            if manifest is None or top is None:
                raise _hostile(archive, "holds no manifest.json")
            missing = sorted(set(manifest.files) - written)
            if missing:
                raise _hostile(archive, f"is missing {len(missing)} listed file(s), e.g. {missing[0]!r}")
            return top
