"""A detector's room: the small frozen record each detector module registers with :mod:`sgl_seat.core.detect`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sgl_seat.core.observation import Observation
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec

#: A detector: the observation, the thresholds and ``now`` in; a verdict (without its waiting ranks) or None out.
Run = Callable[[Observation, WatchdogSpec, float], Verdict | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Detector:
    """One hang detector, as :func:`~sgl_seat.core.detect.detect` runs it and as the rest of the house must know it.

    Why a record and not a bare function: a detector's kind is also in ``VerdictKind``, the bundle schema's enum and
    the runbook's verdict table, and the thresholds it reads are in ``watchdog/thresholds.yaml``; with the record, a
    unit test (``tests/unit/test_detect_rooms.py``) holds each of those to the registry, so a new detector that
    misses one fails there instead of shipping a verdict no bundle reader or operator knows.
    """

    #: The verdict it writes (one detector per kind).
    kind: VerdictKind
    #: Its place when several fire, lower first: the first is the verdict, the others are kept in its evidence.
    priority: int
    #: The ``watchdog:`` thresholds (``WatchdogSpec`` fields) it reads, itself or through its helpers.
    thresholds: tuple[str, ...]
    #: The shape of its first evidence line, a regular expression matched at the line's start: the line that
    #: ``also: ...`` repeats when another detector wins, that the runbook quotes and that remediation reads a row-fetch
    #: stall's gather size from.
    evidence: str
    #: The detector itself: pure, every record later than ``now`` ignored.
    run: Run
