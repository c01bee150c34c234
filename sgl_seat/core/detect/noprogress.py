"""Detector 6, **no progress**: no token progress on rank 0's ``/metrics`` for ``no_progress_s`` while requests run.

And no probed row fetch finished in that time either (:func:`~sgl_seat.core.detect.progress.last_fetch_end`). The
weakest signal (it says *that*, not *where*), so it comes last; its rank is attributed from stacks and probe records
when they allow (:func:`_attribute`).
"""

from __future__ import annotations

import numpy as np

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.detect.forward import forward_last_seen, one_forward
from sgl_seat.core.detect.progress import last_fetch_end, metrics_upto, progress_sig
from sgl_seat.core.detect.waits import rank_of_pid
from sgl_seat.core.detect.words import fmt_s
from sgl_seat.core.frames import collective_frame, stuck_frame
from sgl_seat.core.observation import Observation, in_flight, latest_by_pid, node_of, probe_targets, python_samples
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec


def detect_no_progress(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    pts = metrics_upto(obs, now)
    if len(pts) < 2:
        return None
    last = pts[-1]
    if now - last.t > max(th.no_progress_s, 3.0):
        return None  # metrics went stale: nothing to say from them
    sig = progress_sig(last, obs.words)
    if not sig:
        return None
    flat_since = last.t
    for m in reversed(pts[:-1]):
        if progress_sig(m, obs.words) != sig:
            break
        flat_since = m.t
    span = [m for m in pts if m.t >= flat_since]
    if last.t - flat_since < th.no_progress_s or not all(m.values.get(obs.words.running, 0.0) > 0 for m in span):
        return None
    fetched = last_fetch_end(obs.probes, now)
    if fetched is not None and last.t - fetched < th.no_progress_s:
        return None  # row fetches still complete: the engine steps, its /metrics lag (see went_round)
    fwd = one_forward(obs, th, now)
    if fwd is not None and now - fwd.since < th.engine_timeout_s:
        return None  # every rank in one long forward (a long prefill), not a hang; bounded as above
    seen = forward_last_seen(obs, th, now, flat_since)
    if seen is not None and seen - flat_since < th.engine_timeout_s and last.t - seen < th.no_progress_s:
        return None  # flat only since a long forward ended (metrics lag it): count from its end
    rank, node, frame, why = _attribute(obs, now)
    ev = [f"no token progress for {fmt_s(last.t - flat_since)} while {int(last.get(obs.words.running))} requests run "
          f"(threshold {fmt_s(th.no_progress_s)})"]
    if why:
        ev.append(why)
    return Verdict(kind=VerdictKind.NO_PROGRESS, rank=rank, node=node, frame=frame, t=now, evidence=tuple(ev))


def _attribute(obs: Observation, now: float) -> tuple[int | None, int | None, str | None, str | None]:
    """Who lags, for a verdict that does not say: the oldest in-flight probe, else the one scheduler
    whose latest stack is not in a collective while the others are."""
    pc = obs.probes
    host = pc.in_flight_at(now)
    rows = np.flatnonzero(host | pc.gpu_in_flight_at(now))
    targets = probe_targets(obs)
    if rows.size:
        # Since when: the call's start while it runs, else its GPU work's; oldest first, ties by rank, pid, then
        # the observation's order (lexsort is stable).
        gs = pc.gpu_start[rows]
        t = np.where(host[rows] | (gs == 0.0), pc.start[rows], gs)  # (the record form read `gpu_start or start`)
        k = int(np.lexsort((pc.pid[rows], pc.rank[rows], t))[0])
        since, p = float(t[k]), pc.record(int(rows[k]))
        rank = p.rank if p.rank >= 0 else rank_of_pid(obs, p.pid)
        where = "in flight" if in_flight(p, now) else "in flight on the GPU"
        if p.graph_replay:
            where += f": graph replay, {p.gather_size} tokens, shape key {p.graph_key}"
        return (rank, node_of(obs, rank, p.node if p.node >= 0 else None),
                f"{p.target.rsplit(':', 1)[-1].rsplit('.', 1)[-1]} ({p.target})",
                f"rank {rank} has a row fetch {where} for {fmt_s(now - since)}")
    latest = [s for s in latest_by_pid(python_samples(obs, now)).values()
              if s.rank is not None and obs.words.is_rank_process(s.title)]
    free = [s for s in latest if collective_frame(s.main_thread()) is None]
    if latest and len(free) == 1 and len(latest) > 1:
        s = free[0]
        f = stuck_frame(s.main_thread(), targets)
        return (s.rank, s.node, f.label if f else None,
                f"rank {s.rank} is the only scheduler not waiting in a collective")
    return None, None, None, None


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.NO_PROGRESS,
    priority=6,
    thresholds=("engine_timeout_s", "no_progress_s", "sample_hz"),
    evidence=r"no token progress for \d+\.\ds while -?\d+ requests run \(threshold \d+\.\ds\)",
    run=detect_no_progress,
)
