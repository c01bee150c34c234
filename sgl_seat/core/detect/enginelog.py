"""Detector 5, **engine watchdog**: SGLang's own ``Scheduler watchdog timeout`` log line.

Late (at ``--watchdog-timeout``), but definitive when nothing above fired.
"""

from __future__ import annotations

import re

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.frames import stuck_frame
from sgl_seat.core.observation import Observation, node_of, probe_targets, python_samples
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec

_LOG_RANK = re.compile(r"\bTP(\d+)\b")


def detect_engine_watchdog(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    line = obs.words.hang_log_line  # the engine's own watchdog's line (:class:`~sgl_seat.core.vocabulary.EngineWords`)
    hits = [ln for ln in obs.logs if line and ln.t <= now and line in ln.text]
    if not hits:
        return None
    first = hits[0]
    m = _LOG_RANK.search(first.text)
    rank = int(m.group(1)) if m else None
    node = first.node if rank is None else node_of(obs, rank, first.node)
    frame = None
    if rank is not None:
        latest = [s for s in python_samples(obs, now) if s.rank == rank and s.error is None and s.threads]
        if latest:
            f = stuck_frame(latest[-1].main_thread(), probe_targets(obs))
            frame = f.label if f else None
    ev = [f"node {first.node} log: {first.text.strip()[:300]}"]
    return Verdict(kind=VerdictKind.ENGINE_WATCHDOG, rank=rank, node=node, frame=frame, t=now, evidence=tuple(ev))


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.ENGINE_WATCHDOG,
    priority=5,
    thresholds=(),
    evidence=r"node -?\d+ log: ",
    run=detect_engine_watchdog,
)
