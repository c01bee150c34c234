"""Finding bundles on disk: ``$SGLSEAT_HOME/bundles/<seat>/<id>/`` and the directories of seats whose spec sets
``bundles.dir`` (``<dir>/<id>/``), listed newest first.

Listing reads only each manifest (a full verify hashes every file, too slow for ``ls`` over many
bundles); a bundle whose manifest does not parse is still listed, with its error, so a damaged capture
is visible rather than silently skipped. ``resolve_bundle`` lets commands take a path or a bare id. Which
directory belongs to which seat is not decided here (``sgl_seat.forensics.format.layout.seat_bundles_dir``); callers
that know the recorded seats pass their directories as ``seat_dirs``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgl_seat.errors import BundleError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.archive import is_archive
from sgl_seat.forensics.format.codec import loads_document
from sgl_seat.forensics.format.manifest import Manifest

__all__ = ["BundleSummary", "bundles_in", "list_bundles", "resolve_bundle"]


@dataclass(frozen=True, slots=True)
class BundleSummary:
    """One bundle as ``bundle ls`` shows it."""

    path: Path
    seat: str
    bundle_id: str
    created: float | None
    trigger: dict[str, Any]
    verdict: dict[str, Any] | None
    size_bytes: int
    files: int
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "seat": self.seat, "id": self.bundle_id, "created": self.created,
                "trigger": self.trigger, "verdict": self.verdict, "size_bytes": self.size_bytes,
                "files": self.files, "error": self.error}


def _summary(path: Path, seat_dir: str) -> BundleSummary:
    try:
        with open(path / layout.MANIFEST, "rb") as f:
            data = f.read(layout.MAX_MANIFEST_BYTES + 1)
        if len(data) > layout.MAX_MANIFEST_BYTES:
            raise BundleError("manifest.json is too large")
        m = Manifest.from_json(loads_document(data, "manifest.json"))
    except (OSError, BundleError) as exc:
        msg = exc.message if isinstance(exc, BundleError) else (exc.strerror or str(exc))
        return BundleSummary(path, seat_dir, path.name, None, {}, None, 0, 0, error=msg.splitlines()[0])
    return BundleSummary(path, m.seat, m.bundle_id, m.created, dict(m.trigger),
                         None if m.verdict is None else m.verdict.to_json(), m.total_size + len(data),
                         len(m.files) + 1)


def _newest_first(items: list[BundleSummary]) -> list[BundleSummary]:
    return sorted(items, key=lambda s: (-(s.created or 0.0), s.seat, s.bundle_id))


def bundles_in(seat_dir: Path) -> list[BundleSummary]:
    """The bundles directly in one seat's bundle directory, newest first."""
    if not seat_dir.is_dir():
        return []
    return _newest_first([_summary(Path(e.path), seat_dir.name)
                          for e in sorted(os.scandir(seat_dir), key=lambda e: e.name)
                          if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)])


def list_bundles(root: Path | None = None, *, seat: str | None = None,
                 seat_dirs: Iterable[Path] = ()) -> list[BundleSummary]:
    """Every bundle under ``root`` (default ``$SGLSEAT_HOME/bundles``), optionally one seat's, and every bundle in
    ``seat_dirs`` (the directories of seats whose spec sets ``bundles.dir``), newest first, each once."""
    root = Path(root) if root is not None else layout.bundles_home()
    dirs: list[Path] = []
    if root.is_dir():
        dirs = [root / seat] if seat else sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    seen: set[Path] = set()
    out: list[BundleSummary] = []
    for sdir in [*dirs, *seat_dirs]:
        key = sdir.resolve()
        if key not in seen:
            seen.add(key)
            out += bundles_in(sdir)
    return _newest_first(out)


def resolve_bundle(ref: str, *, seat_dirs: Iterable[Path] = ()) -> Path:
    """A bundle path from a path (directory or .tar.zst) or a bare bundle id under the bundles home or in one of
    ``seat_dirs``."""
    p = Path(ref).expanduser()
    if p.exists():
        return p
    if layout.BUNDLE_ID_RE.match(ref) and not is_archive(p):
        hits = [s.path for s in list_bundles(seat_dirs=seat_dirs) if s.bundle_id == ref or s.path.name == ref]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise BundleError(f"bundle id {ref!r} exists for several seats",
                              fix="pass the path: " + ", ".join(str(h) for h in hits[:4]))
    raise BundleError(f"no bundle at {ref}", fix="pass a bundle directory or .tar.zst; `sgl-seat bundle ls` lists "
                                                 f"the bundles under {layout.bundles_home()}")


#: How often :func:`wait_for_bundle` looks.
POLL_S = 0.2


def complete_bundles(d: Path) -> set[Path]:
    """Bundle directories with their manifest (written last; in-progress writes are dot-named temp dirs)."""
    if not d.is_dir():
        return set()
    return {p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / layout.MANIFEST).is_file()}


def wait_for_bundle(d: Path, before: set[Path], timeout: float) -> tuple[Path, float] | None:
    """The first new complete bundle under ``d`` and when it was seen (``time.time()``), or None."""
    deadline = time.monotonic() + timeout
    while True:
        new = sorted(complete_bundles(d) - before)
        if new:
            return new[0], time.time()
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)
