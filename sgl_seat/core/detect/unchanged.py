"""Detector 4, **stack unchanged**: a scheduler's main-thread stack identical for ``stack_unchanged_samples`` samples.

It fires while requests run and nothing progresses, and, where the rank is probed, none of its probed calls began or
ended between those samples (:func:`~sgl_seat.core.detect.progress.went_round`). Ranks stuck in a collective are
victims, so the rank that is *not* in a collective is named; the frame is where it sits. When every unchanged rank
waits in a collective or device sync and the probe records carry GPU timing, the stacks are undecided (on a GPU the
culprit's CPU thread waits there too): no verdict from stacks, the GPU record decides (detector 3) or the no-progress
detector reports it later. Every rank sitting at the same frame of work, outside any collective, is one long forward (a
400k-token prefill), not a hang (:func:`~sgl_seat.core.detect.forward.one_forward`): this detector and no-progress hold
off until it has lasted ``engine_timeout_s``, SGLang's own bound on a forward.

"Requests run" comes from ``sglang:num_running_reqs``; where no metrics were recorded, this detector accepts probe
activity just before the window instead (the engine was busy when it froze).
"""

from __future__ import annotations

import numpy as np

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.detect.forward import forward_span, one_forward
from sgl_seat.core.detect.progress import metrics_upto, went_round, window_state
from sgl_seat.core.detect.waits import collective_wait
from sgl_seat.core.detect.words import fmt_s
from sgl_seat.core.frames import stuck_frame
from sgl_seat.core.observation import Observation, probe_targets, python_samples
from sgl_seat.core.records import StackSample, Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec


def detect_stack_unchanged(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    k = th.stack_unchanged_samples
    period = 1.0 / th.sample_hz
    pts = metrics_upto(obs, now)
    targets = probe_targets(obs)
    by_pid: dict[int, list[StackSample]] = {}
    for s in python_samples(obs, now):
        if s.rank is not None and obs.words.is_rank_process(s.title):
            by_pid.setdefault(s.pid, []).append(s)
    cands: list[tuple[float, int, StackSample, int]] = []  # (window start, rank, latest sample, pid)
    for pid, ss in by_pid.items():
        ok = [s for s in ss if s.error is None and s.main_thread() is not None]
        if len(ok) < k:
            continue
        last_k = ok[-k:]
        sigs = {s.main_thread().signature() for s in last_k}  # type: ignore[union-attr]
        if len(sigs) != 1 or not next(iter(sigs)):
            continue
        t0, t1 = last_k[0].t, last_k[-1].t
        # Fresh (the last sample is recent) and spread out (not a burst of dumps at one instant).
        if now - t1 > max(3.0 * period, 5.0) or t1 - t0 < 0.5 * (k - 1) * period:
            continue
        if went_round(obs.probes, pid, t0, t1):
            continue  # sampled at one line each time, but its probed call ran in between: stuck in no call
        state = window_state(pts, t0, t1, obs.words)
        if state is not None:
            ran, progressed = state
            if not ran or progressed:
                continue
        else:
            # No metrics: accept only if the node's probes were busy just before the window and quiet in it.
            node = last_k[-1].node
            ends = obs.probes.end[(obs.probes.node == node) | np.isin(obs.probes.pid, list(by_pid))]  # NaN: in flight
            busy_before = bool(np.any((t0 - 2.0 * period - 2.0 <= ends) & (ends <= t0)))
            quiet = not np.any((t0 < ends) & (ends <= t1))
            if not (busy_before and quiet):
                continue
        rank = last_k[-1].rank
        assert rank is not None
        cands.append((t0, rank, last_k[-1], pid))
    if not cands:
        return None
    fwd = one_forward(obs, th, now)
    if fwd is not None and now - fwd.since < th.engine_timeout_s:
        return None  # every rank in one long forward: no rank lags (the engine's own watchdog bounds it)
    span = forward_span(obs, th, now, min(c[0] for c in cands))
    if span is not None and span[1] - span[0] < th.engine_timeout_s:
        cands = [c for c in cands if c[0] > span[1]]  # unchanged since within a long forward: count from its end
        if not cands:
            return None
    waiting = {c[1] for c in cands if collective_wait(c[2].main_thread(), targets) is not None}
    lagging = [c for c in cands if c[1] not in waiting]
    pick = sorted(lagging or cands, key=lambda c: (c[0], c[1]))[0]
    t0, rank, sample, _pid = pick
    thread = sample.main_thread()
    frame = stuck_frame(thread, targets)
    ev = [f"rank {rank} main-thread stack unchanged for {k} samples over {fmt_s(sample.t - t0)}"
          + (f" at {frame.label}" if frame else "")]
    if not lagging:
        if np.any(obs.probes.gpu & (obs.probes.start <= now)):
            # On a GPU the culprit's CPU thread runs on into the collective too (its stalled kernel does not
            # hold it): identical waits do not say who lags, and the GPU records can. Undecided, no verdict.
            return None
        ev.append(f"every unchanged rank on record ({sorted(c[1] for c in cands)}) waits in a collective; "
                  "the lagging rank was not sampled")
        return Verdict(kind=VerdictKind.STACK_UNCHANGED, rank=None, node=None,
                       frame=frame.label if frame else None, t=now, evidence=tuple(ev))
    return Verdict(kind=VerdictKind.STACK_UNCHANGED, rank=rank, node=sample.node,
                   frame=frame.label if frame else None, t=now, evidence=tuple(ev))


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.STACK_UNCHANGED,
    priority=4,
    thresholds=("engine_timeout_s", "sample_hz", "stack_unchanged_samples"),
    evidence=r"rank -?\d+ main-thread stack unchanged for \d+ samples over ",
    run=detect_stack_unchanged,
)
