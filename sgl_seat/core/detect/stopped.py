"""Detector 2, **process stopped**: an engine process (scheduler, detokenizer or main) stopped by SIGSTOP.

It is in ``/proc`` state ``T`` for ``stopped_s`` in every one of the sidecar's 20 Hz ``/proc`` reads
(``EngineProcess.stopped_since``), or, in a bundle without them, in every sample, at least two (the sampler reads the
state before each dump, and samples a stopped detokenizer or main process every round). Named from the process table,
whether or not its stack could be read; its peers' probed calls and collectives wait for it, so it comes before them.
For a detokenizer the evidence says whether the schedulers still progress.
"""

from __future__ import annotations

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.detect.progress import last_fetch_end, metrics_upto, window_state
from sgl_seat.core.detect.words import fmt_s, fmt_th
from sgl_seat.core.frames import stuck_frame
from sgl_seat.core.observation import Observation, probe_targets, python_samples
from sgl_seat.core.records import StackSample, Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec


def detect_process_stopped(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    """An engine process (scheduler, detokenizer or main) stopped (``/proc`` state ``T``: SIGSTOP) in every one of
    at least two samples spanning ``stopped_s``, up to its latest one.

    Why: a stopped process is alive and keeps its stack (py-spy may still read it, unchanged, or fail), so no
    other detector says what happened; its peers' probed calls and collectives wait for it and look like the
    hang. Named from the process table and the samples' state, whether or not its stack could be read.
    """
    period = 1.0 / th.sample_hz
    by_pid: dict[tuple[int, int], list[StackSample]] = {}
    for s in python_samples(obs, now):
        by_pid.setdefault((s.node, s.pid), []).append(s)
    for ss in by_pid.values():
        ss.sort(key=lambda x: x.t)
    table = {(p.node, p.pid): p for p in obs.processes}
    # (stopped since, how it was seen, node, pid, rank, title); from the sidecar's 20 Hz /proc reads where the
    # process table has them (EngineProcess.stopped_since), else from the stack samples' state (older bundles).
    found: list[tuple[float, str, int, int, int | None, str]] = []
    for ep in table.values():
        if not ep.alive or ep.stopped_since is None or ep.state_t is None:
            continue
        if ep.stopped_since + th.stopped_s <= min(now, ep.state_t) and now - ep.state_t <= max(3.0 * period, 5.0):
            found.append((ep.stopped_since, "in every /proc read from then to "
                          f"{fmt_s(ep.state_t - ep.stopped_since)} after", ep.node, ep.pid, ep.rank, ep.title))
    seen = {(f[2], f[3]) for f in found}
    for key, ss in by_pid.items():
        p = table.get(key)
        if key in seen or (p is not None and not p.alive):
            continue  # read already, or gone: the exited detector's
        run: list[StackSample] = []
        for x in reversed(ss):
            if x.state != "T":
                break
            run.append(x)
        run.reverse()
        if len(run) < 2 or run[-1].t - run[0].t < th.stopped_s or now - run[-1].t > max(3.0 * period, 5.0):
            continue
        found.append((run[0].t, f"{len(run)} samples", key[0], key[1],
                      p.rank if p is not None else run[-1].rank, p.title if p is not None else run[-1].title))
    if not found:
        return None
    # The first to stop; ties: a scheduler (it holds its peers), then the lowest rank.
    found.sort(key=lambda f: (f[0], f[4] is None, f[4] if f[4] is not None else 0, f[3]))
    since, how, node, pid, rank, title = found[0]
    every = by_pid.get((node, pid), [])
    readable = [x for x in every if x.error is None and x.threads]  # while stopped or, failing that, before
    frame = stuck_frame(readable[-1].main_thread(), probe_targets(obs)) if readable else None
    unread = bool(every) and not any(x.error is None and x.threads for x in every if x.t >= since)
    ev = [f"pid {pid} ({title}) on node {node} stopped (state T) for {fmt_s(now - since)} "
          f"({how}; threshold {fmt_th(th.stopped_s)})"
          + ("; its stack could not be read while stopped" if unread else "")]
    if rank is None:
        # A stopped detokenizer (or main process) holds no collective: say whether the schedulers still step.
        state = window_state(metrics_upto(obs, now), since, now, obs.words)
        fetched = last_fetch_end(obs.probes, now)
        moved = (state is not None and state[1]) or (fetched is not None and fetched > since)
        if moved:
            ev.append("the schedulers still progress since it stopped (tokens or probed calls move): "
                      "outputs are not detokenized, requests do not finish")
        elif state is not None and not state[0]:
            ev.append("no requests run (the schedulers are idle)")
        else:
            ev.append("the schedulers made no progress since it stopped")
    elif frame is not None:
        ev.append(f"last sampled at {frame.label}")
    for f in found[1:6]:
        ev.append(f"also stopped: pid {f[3]} ({f[5]}) on node {f[2]} for {fmt_s(now - f[0])}")
    return Verdict(kind=VerdictKind.PROCESS_STOPPED, rank=rank, node=node,
                   frame=frame.label if frame else None, t=now, evidence=tuple(ev))


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.PROCESS_STOPPED,
    priority=2,
    thresholds=("sample_hz", "stopped_s"),
    evidence=r"pid \d+ \(.*\) on node \d+ stopped \(state T\) for ",
    run=detect_process_stopped,
)
