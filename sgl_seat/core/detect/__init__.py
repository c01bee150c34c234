"""Hang detectors: pure functions from recorded observations to one :class:`~sgl_seat.core.records.Verdict`.

The live sidecar (``sgl_seat.watchdog``) and offline ``replay`` (``sgl_seat.forensics``) call the same
:func:`detect` on the same record types, so a replayed bundle reproduces the live verdict. Nothing here
touches Ray, psutil, files or the clock: ``now`` is an argument, and every record later than ``now`` is
ignored (a fetch that ended after ``now`` counts as in flight at ``now``), so ``detect(obs, thresholds, now)``
is a function of its inputs.

One module per detector, each registering a :class:`~sgl_seat.core.detect.descriptor.Detector` (its kind, priority,
the thresholds it reads, the shape of its evidence); :data:`DETECTORS` holds them in priority order, and when several
fire the first is the verdict and the others are kept in its evidence:

1. **process exited** (:mod:`.exited`): an engine process seen earlier is gone.
2. **process stopped** (:mod:`.stopped`): an engine process stopped (SIGSTOP, ``/proc`` state ``T``).
3. **row-fetch stall** (:mod:`.fetchstall`): a probed call (or CUDA graph replay) late on the host or the GPU.
4. **stack unchanged** (:mod:`.unchanged`): a scheduler's stack identical while nothing progresses.
5. **engine watchdog** (:mod:`.enginelog`): SGLang's own ``Scheduler watchdog timeout`` line.
6. **no progress** (:mod:`.noprogress`): no token progress while requests run.

:data:`NODE_KINDS` are the verdicts the capture writes for a node that cannot speak for itself
(:mod:`sgl_seat.core.nodeloss`); no detector here makes them. Every kind, a detector's or a node's, is in
``VerdictKind``, the bundle schema's enum and the runbook's verdict table: ``tests/unit/test_detect_rooms.py`` holds
them to this registry.

A probed call is matched to a frame by its qualified name (:func:`~sgl_seat.core.frames.frame_is_target`): a
real engine's targets are methods, and every layer has a ``forward``.

An idle engine fires nothing: SGLang's idle spin in ``Scheduler._poll_timeout_aborts``, the TP>1 idle broadcast of
the request receiver, and ``--sleep-on-idle``'s zmq poll all run no requests (``tests/unit/test_core_detect_real.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sgl_seat.core.detect import enginelog, exited, fetchstall, noprogress, stopped, unchanged
from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.detect.enginelog import detect_engine_watchdog
from sgl_seat.core.detect.exited import detect_process_exited
from sgl_seat.core.detect.fetchstall import EVIDENCE_WINDOW_S, detect_rowfetch_stall
from sgl_seat.core.detect.forward import OneForward, forward_last_seen, forward_span, one_forward
from sgl_seat.core.detect.noprogress import detect_no_progress
from sgl_seat.core.detect.progress import last_fetch_end, went_round
from sgl_seat.core.detect.stopped import detect_process_stopped
from sgl_seat.core.detect.unchanged import detect_stack_unchanged
from sgl_seat.core.detect.waits import collective_wait, waiting_ranks
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec

__all__ = [
    "DETECTORS",
    "EVIDENCE_WINDOW_S",
    "NODE_KINDS",
    "Detector",
    "OneForward",
    "collective_wait",
    "detect",
    "detect_all",
    "detect_engine_watchdog",
    "detect_no_progress",
    "detect_process_exited",
    "detect_process_stopped",
    "detect_rowfetch_stall",
    "detect_stack_unchanged",
    "forward_last_seen",
    "forward_span",
    "last_fetch_end",
    "one_forward",
    "thresholds_from",
    "waiting_ranks",
    "went_round",
]

#: Every detector, in priority order. A new detector is a new module here with its ``DETECTOR``, named in this tuple.
DETECTORS: tuple[Detector, ...] = tuple(sorted(
    (exited.DETECTOR, stopped.DETECTOR, fetchstall.DETECTOR, unchanged.DETECTOR, enginelog.DETECTOR,
     noprogress.DETECTOR),
    key=lambda d: d.priority))

#: Verdicts no detector here makes: the capture writes them for a node that did not answer it (node-unreachable) or
#: that found itself cut off (node-isolated), in :mod:`sgl_seat.core.nodeloss`.
NODE_KINDS: tuple[VerdictKind, ...] = (VerdictKind.NODE_UNREACHABLE, VerdictKind.NODE_ISOLATED)


def detect_all(obs: Observation, thresholds: WatchdogSpec, now: float) -> list[Verdict]:
    """Every detector that fires, in priority order (without waiting ranks)."""
    out = []
    for det in DETECTORS:
        v = det.run(obs, thresholds, now)
        if v is not None:
            out.append(v)
    return out


def detect(obs: Observation, thresholds: WatchdogSpec, now: float) -> Verdict | None:
    """The highest-priority finding, with the ranks waiting in a collective; None when all is well.

    Replay: ``detect(Observation.of(samples=b.stacks, probes=b.probes, metrics=b.metrics, logs=b.logs,
    processes=b.processes, rank_nodes=m.rank_nodes), WatchdogSpec.model_validate(m.thresholds), m.verdict.t)``.
    """
    found = detect_all(obs, thresholds, now)
    if not found:
        return None
    top = found[0]
    ev = list(top.evidence)
    for v in found[1:]:
        ev.append(f"also: {v.kind.value}" + (f" (rank {v.rank})" if v.rank is not None else "")
                  + (f": {v.evidence[0]}" if v.evidence else ""))
    return Verdict(kind=top.kind, rank=top.rank, node=top.node, frame=top.frame, t=now, evidence=tuple(ev),
                   waiting_ranks=waiting_ranks(obs, now, exclude=(top.rank,)))


def thresholds_from(doc: Mapping[str, Any] | None) -> WatchdogSpec:
    """WatchdogSpec from a manifest's ``thresholds`` (unknown keys dropped; missing ones default)."""
    known = set(WatchdogSpec.model_fields)
    return WatchdogSpec.model_validate({k: v for k, v in (doc or {}).items() if k in known})
