"""When a rehearsal fault began and when its bundle was written, read from the bundle: the two ends of the
"fault -> bundle" figure the real soak (bench/realsoak.py) and the GPU bench (bench/gpu/draft_seat.py) both report."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def stalled_call_start(bundle: Path, rank: int) -> float | None:
    """The start of ``rank``'s in-flight probed call in the bundle (the stalled one)."""
    from sgl_seat.forensics.format.bundle import read_bundle

    starts = [p.start for p in read_bundle(bundle).probes if p.rank == rank and p.end is None]
    return max(starts) if starts else None


def bundle_written_t(manifest: dict[str, Any]) -> float:
    """When the bundle itself was written: before its late native stacks where the manifest has them."""
    late = manifest.get("late") or {}
    return float(late["t"]) - float(late["after_bundle_s"]) if late else float(manifest["created"])
