"""``replay``: verify and load a bundle, re-run the detectors, analyse, and hold the result for the reports.

:func:`replay_bundle` is the one library call behind ``sgl-seat replay``; the renderers (terminal, JSON,
HTML, speedscope, Chrome trace) all take its :class:`ReplayResult`, so every output says the same thing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sgl_seat import __version__
from sgl_seat.core.records import Verdict
from sgl_seat.core.warning import PreHangWarning
from sgl_seat.forensics.format.archive import is_archive, unpack_bundle
from sgl_seat.forensics.format.bundle import Bundle, read_bundle
from sgl_seat.forensics.replay.agree import agree
from sgl_seat.forensics.replay.analysis import Analysis, analyse
from sgl_seat.forensics.replay.redetect import first_warning_before, rerun_detectors

__all__ = ["REPORT_SCHEMA_VERSION", "ReplayResult", "load_any", "replay_bundle"]

#: Version of the ``replay --json`` document.
REPORT_SCHEMA_VERSION = 1


@dataclass(slots=True)
class ReplayResult:
    """A replayed bundle: the records, the recorded and replayed verdicts, and the analysis."""

    source: Path
    bundle: Bundle
    analysis: Analysis
    recorded: Verdict | None
    replayed: Verdict | None
    detector_note: str | None
    #: The first pre-hang warning in the row-fetch history before the trigger (``redetect.first_warning_before``).
    warning: PreHangWarning | None = None

    @property
    def verdict(self) -> Verdict | None:
        """The replayed verdict where the detectors ran, else the recorded one."""
        return self.replayed if self.replayed is not None else self.recorded

    @property
    def verdict_matches(self) -> bool | None:
        """Whether the replayed verdict names the same kind, rank, node and frame as the capture's.

        A consistency check of the bundle, not independent evidence: the capture computed its verdict with the
        same detectors over the same records.
        """
        if self.replayed is None or self.recorded is None:
            return None
        a, b = self.replayed, self.recorded
        return (a.kind, a.rank, a.node, a.frame) == (b.kind, b.rank, b.node, b.frame)

    @property
    def live(self) -> Verdict | None:
        """The triggering sidecar's own live verdict (its node's view before the merge), if the bundle has it."""
        return self.bundle.manifest.live_verdict

    @property
    def live_matches(self) -> bool | None:
        """Whether the replayed verdict names the same kind, rank and node as the triggering sidecar did live.

        That sidecar judged its own node's live records before any other node's were merged in, so agreement
        here is a comparison between two views, unlike :attr:`verdict_matches`. The frame is not compared:
        the live view may have sampled the rank a tick earlier.
        """
        if self.verdict is None or self.live is None:
            return None
        a, b = self.verdict, self.live
        return (a.kind, a.rank, a.node) == (b.kind, b.rank, b.node)

    @property
    def comparison(self) -> str:
        """One line that says what the verdict was compared with and what that comparison is worth."""
        live = self.live
        if self.live_matches is True and live is not None:
            return (f"agrees with the verdict the triggering sidecar reached live ({live.kind.value}, rank "
                    f"{live.rank}, node {live.node})")
        if self.live_matches is False and live is not None:
            return (f"DIFFERS from the triggering sidecar's live verdict ({live.kind.value}, rank {live.rank}, node "
                    f"{live.node}): the merged records of every node tell more than that node saw")
        if self.verdict_matches is True:
            return ("consistency check only: replay gives the capture's verdict again (same detectors, same "
                    "records); this bundle holds no live verdict of the triggering sidecar to compare with")
        if self.verdict_matches is False:
            return "replayed verdict DIFFERS from the one the capture recorded from the same records"
        return f"verdict {'replayed' if self.replayed is not None else 'recorded'}" + (
            f" ({self.detector_note})" if self.detector_note else "")

    def to_json(self) -> dict[str, Any]:
        """The ``replay --json`` document (times relative to the trigger, in seconds)."""
        m = self.bundle.manifest
        trig = self.analysis.trigger_t

        def vj(v: Verdict | None) -> dict[str, Any] | None:
            if v is None:
                return None
            doc = {"kind": v.kind.value, "rank": v.rank, "node": v.node, "frame": v.frame,
                   "t_s": round(v.t - trig, 3), "evidence": list(v.evidence), "waiting_ranks": list(v.waiting_ranks)}
            if v.node_ranks:  # node-unreachable only: the golden reports of other verdicts keep their keys
                doc["node_ranks"] = list(v.node_ranks)
            return doc

        a = self.analysis
        return {
            "report_schema_version": REPORT_SCHEMA_VERSION,
            "bundle": {
                "id": m.bundle_id,
                "seat": m.seat,
                "created": m.created,
                "trigger": m.trigger,
                "nodes": list(m.nodes),
                "ranks": list(m.ranks),
                "time_range_s": [round(m.time_start - trig, 3), round(m.time_end - trig, 3)],
                "versions": m.versions,
                "files": len(m.files),
                "size_bytes": m.total_size,
                "redaction": m.redaction,
            },
            "verdict": vj(self.verdict),
            "verdict_source": "replayed" if self.replayed is not None else "recorded",
            "recorded_verdict": vj(self.recorded),
            "verdict_matches": self.verdict_matches,
            "live_verdict": vj(self.live),
            "live_verdict_matches": self.live_matches,
            "comparison": self.comparison,
            "detector_note": self.detector_note,
            "divergence": a.divergence,
            "stuck": a.stuck,
            "rowfetch": a.rowfetch,
            "activity": a.activity,
            "exited": a.exited,
            "log_tail": a.log_tail,
            "timeline": a.timeline,
            "notes": a.notes,
            "tool": f"sgl-seat {__version__}",
        } | ({"prehang_warning": self._warning_json(trig)} if self.warning is not None else {})

    def _warning_json(self, trig: float) -> dict[str, Any]:
        """The warning, timed like the verdict (seconds to the trigger); only where one was raised, so the reports
        of bundles without one keep their keys."""
        w = self.warning
        assert w is not None
        return {"kind": w.kind, "t_s": round(w.t - trig, 3), "rank": w.rank, "node": w.node, "gather": w.gather,
                "recent_p99_ms": round(w.recent_p99_s * 1e3, 3), "baseline_p99_ms": round(w.baseline_p99_s * 1e3, 3),
                "slow": w.slow, "summary": w.summary(), "evidence": list(w.evidence)}


def load_any(path: Path, *, max_unpacked_bytes: int | None = None) -> Bundle:
    """Read a bundle directory, or a ``.tar.zst`` (unpacked safely into a temporary directory first, refused
    before a byte is written if it claims more than ``max_unpacked_bytes``: see ``archive.unpack_bundle``)."""
    path = Path(path)
    if is_archive(path):
        with tempfile.TemporaryDirectory(prefix="sgl-seat-replay-") as tmp:
            inner = unpack_bundle(path, Path(tmp), max_unpacked_bytes=max_unpacked_bytes)
            b = read_bundle(inner)
        return Bundle(**{**{f: getattr(b, f) for f in b.__dataclass_fields__}, "path": path})
    return read_bundle(path)


def replay_bundle(path: Path, *, max_unpacked_bytes: int | None = None) -> ReplayResult:
    """Verify, load, re-detect and analyse one bundle (directory or .tar.zst, capped as in :func:`load_any`)."""
    bundle = load_any(Path(path), max_unpacked_bytes=max_unpacked_bytes)
    replayed, note = rerun_detectors(bundle)
    verdict = replayed if replayed is not None else bundle.manifest.verdict
    return ReplayResult(source=Path(path), bundle=bundle, analysis=agree(analyse(bundle), verdict, bundle),
                        recorded=bundle.manifest.verdict, replayed=replayed, detector_note=note,
                        warning=first_warning_before(bundle))
