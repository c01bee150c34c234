"""One long forward (a 400k-token prefill): every rank at one frame of work, which is not a hang."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sgl_seat.core.frames import collective_frame, stuck_frame, target_frame
from sgl_seat.core.observation import Observation, probe_targets, python_samples
from sgl_seat.core.records import StackSample
from sgl_seat.spec import WatchdogSpec


@dataclass(frozen=True, slots=True)
class OneForward:
    """Every scheduler rank on record in one forward: the frame they share and since when all are there."""

    frame: str
    since: float


_Sig = tuple[tuple[str, str, int], ...]


def _scheduler_stacks(obs: Observation, now: float, since: float) -> dict[int, list[tuple[float, _Sig, StackSample]]]:
    """Each scheduler process's good samples in [since, now], time-sorted, with their main thread's signature."""
    out: dict[int, list[tuple[float, _Sig, StackSample]]] = {}
    memo: dict[int, _Sig] = {}  # by stack identity: a bundle's samples share their stacks
    for s in python_samples(obs, now):
        main = s.main_thread()
        if s.t < since or s.rank is None or not obs.words.is_rank_process(s.title) or s.error is not None \
                or main is None:
            continue
        sig = memo.get(id(main))
        if sig is None:
            sig = memo[id(main)] = main.signature()
        out.setdefault(s.pid, []).append((s.t, sig, s))
    for ts in out.values():
        ts.sort(key=lambda x: x[0])
    return out


def _forward_at(stacks: Mapping[int, list[tuple[float, _Sig, StackSample]]], t: float, fresh_s: float,
                targets: Sequence[str]) -> tuple[StackSample, float] | None:
    """(a sample, since when) if at ``t`` every scheduler rank sits in one forward, else None (see one_forward)."""
    latest: list[tuple[int, list[tuple[float, _Sig, StackSample]]]] = []
    for ts in stacks.values():
        i = bisect.bisect_right(ts, t, key=lambda x: x[0])
        if i:
            latest.append((i, ts))
    if len(latest) < 2:
        return None
    sig = latest[0][1][latest[0][0] - 1][1]
    since = -math.inf
    for i, ts in latest:
        if i < 2 or ts[i - 1][1] != sig or ts[i - 2][1] != sig or t - ts[i - 1][0] > fresh_s or not sig:
            return None
        j = i - 2
        while j > 0 and ts[j - 1][1] == sig:  # the trailing run of this frame: since when the rank has sat there
            j -= 1
        since = max(since, ts[j][0])
    sample = latest[0][1][latest[0][0] - 1][2]
    thread = sample.main_thread()
    if collective_frame(thread) is not None or target_frame(thread, targets) is not None:
        return None
    return sample, since


def one_forward(obs: Observation, th: WatchdogSpec, now: float) -> OneForward | None:
    """Whether every scheduler rank on record sits in one long forward (not a hang), per its latest samples.

    Why: a 400k-token prefill keeps every rank inside one forward for tens of seconds; stacks stay unchanged and
    no token progresses while requests run, which is all the stack and no-progress detectors look at. What tells
    it from a hang is the shape: in a hang one rank lags while its peers wait for it in a collective (or a probed
    fetch or kernel is late, which the row-fetch detector names); in a long forward every rank sits at the same
    frame of work, outside any collective, device sync or probed call. It takes two or more ranks (one rank
    gives no evidence of being in step) whose last two samples are fresh and alike (there for a sample period,
    not passing through). The soak (``bench/watchdog_soak.py``) found this case: a false bundle per long prefill.
    """
    found = _forward_at(_scheduler_stacks(obs, now, -math.inf), now, max(3.0 / th.sample_hz, 5.0), probe_targets(obs))
    if found is None:
        return None
    frame = stuck_frame(found[0].main_thread(), ())
    return OneForward(frame=frame.label if frame else "?", since=found[1])


def forward_last_seen(obs: Observation, th: WatchdogSpec, now: float, since: float) -> float | None:
    """The latest sample time in [since, now] at which every scheduler rank sat in one forward, or None.

    Why: tokens stay flat through a long forward and for a moment after it (``/metrics`` is polled about once a
    second): the no-progress detector counts flatness from the end of the forward, not from its start.
    """
    span = forward_span(obs, th, now, since)
    return None if span is None else span[1]


def forward_span(obs: Observation, th: WatchdogSpec, now: float, since: float) -> tuple[float, float] | None:
    """(since when, last seen) of the latest long forward (see one_forward) seen at a sample time in [since, now].

    Why: a rank's stack sits unchanged through a long forward and for a sample or two after it while its peers
    move on into the next collective (the soak's draft-on prefill of 40 s, then a rank slowed 5x: one rank at its
    step's sleep, three in all_reduce, tokens flat, the very shape of a hang); the stack detector counts from the
    forward's end, and the start says whether the forward itself outlasted SGLang's own bound.
    """
    fresh = max(3.0 / th.sample_hz, 5.0)
    stacks = _scheduler_stacks(obs, now, -math.inf)
    targets = probe_targets(obs)
    for t in sorted({x[0] for ts in stacks.values() for x in ts if x[0] >= since}, reverse=True):
        found = _forward_at(stacks, t, fresh, targets)
        if found is not None:
            return found[1], t
    return None
