"""Progress as the metrics and the probe records say it: tokens moving, calls starting and ending."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import MetricsPoint
from sgl_seat.core.vocabulary import EngineWords


def went_round(pc: ProbeColumns, pid: int, t0: float, t1: float) -> bool:
    """Whether process ``pid`` started or finished a probed call in (t0, t1]: it went round its loop then.

    Why: a healthy sim rank spends most of each step in one line (its sleep to the step's modelled end), and a
    real scheduler in one kernel launch or sync, so 1 Hz samples can find it at the same line five times running
    while it steps. The stacks alone cannot tell that from a rank stuck in one call, and the metrics that
    should (tokens moving) can lag: the CI soak wrote a false stack-unchanged bundle for a healthy rank (5
    samples at ``Scheduler._step`` over 4 s) on a loaded box. A probed call that began or ended between the
    samples is the rank's own word that it was not stuck. A process without probe records gives no such word.
    Heartbeats count (records of a ``beat`` target, :func:`~sgl_seat.core.columns.is_beat`: a decoder layer's
    start): inside one long forward the row fetch comes only at its start, the layers beat throughout.
    """
    mine = pc.pid == pid
    if not bool(np.any(mine)):
        return False
    start, end = pc.start[mine], pc.end[mine]  # NaN end: in flight (compares false)
    return bool(np.any((t0 < start) & (start <= t1)) or np.any((t0 < end) & (end <= t1)))


def last_fetch_end(pc: ProbeColumns, now: float) -> float | None:
    """When the latest probed call that had finished by ``now`` finished (None: none had).

    A finished row fetch is progress as much as a token is (the sidecar's latch counts it so too): a stepping
    engine makes one each forward, while /metrics can lag seconds behind on a loaded host. A heartbeat counts too
    (see :func:`went_round`): a long forward's layers go round while no token moves.
    """
    done = pc.end[pc.end <= now]
    return float(done.max()) if done.size else None


def progress_sig(m: MetricsPoint, words: EngineWords) -> tuple[float, ...]:
    """The values of the engine's progress metrics (:attr:`EngineWords.progress`) ``m`` holds."""
    return tuple(m.values.get(k, math.nan) for k in words.progress if k in m.values)


def metrics_upto(obs: Observation, now: float) -> list[MetricsPoint]:
    pts = [m for m in obs.metrics if m.t <= now]
    pts.sort(key=lambda m: (m.t, m.node))
    return pts


def window_state(pts: Sequence[MetricsPoint], t0: float, t1: float, words: EngineWords) -> tuple[bool, bool] | None:
    """(requests ran throughout, progress happened) over [t0, t1], from the points in it plus the one
    just before; None if no point covers the window."""
    before = [m for m in pts if m.t <= t0]
    inside = [m for m in pts if t0 < m.t <= t1]
    span = ([before[-1]] if before else []) + inside
    running = words.running
    if len(span) < 2 or not running or not any(running in m.values for m in span):
        return None
    ran = all(m.values.get(running, 0.0) > 0 for m in span)
    sigs = [progress_sig(m, words) for m in span]
    progressed = any(a != b for a, b in itertools.pairwise(sigs))
    return ran, progressed
