"""The report's timeline as run lengths over state codes (issue 15.4) gives the segments the per-sample loop gave.

Why: replay walked 28,800 samples one by one to merge them into segments; the timeline now classifies each
distinct threads tuple once and cuts segments where the state code changes. The loop it replaced is kept here
verbatim as the oracle, over seeded samples with failed dumps, empty stacks, repeated and equal times, shared
and unshared thread tuples, several ranks and triggers before, inside and after the samples.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sgl_seat.core.records import Frame, StackSample, ThreadStack
from sgl_seat.forensics.replay import analysis
from sgl_seat.forensics.replay.analysis import RankState, classify_thread

T0 = 1_800_000_000.0


@dataclass(slots=True)
class _Seg:
    start: float
    end: float
    state: str
    frame: str | None
    samples: int


def _ref_timeline(stacks: list[StackSample], trig: float, funcs: frozenset[str]) -> list[dict[str, Any]]:
    """The per-sample loop (the last commit before the run-length form)."""
    by_rank: dict[int, list[StackSample]] = defaultdict(list)
    for s in stacks:
        if s.rank is not None:
            by_rank[s.rank].append(s)
    out = []
    for rank, samples in sorted(by_rank.items()):
        samples.sort(key=lambda s: s.t)
        segs: list[_Seg] = []
        cache: dict[tuple[int, bool], RankState] = {}
        gaps = sorted(b.t - a.t for a, b in itertools.pairwise(samples) if b.t > a.t)
        period = gaps[len(gaps) // 2] if gaps else 1.0
        for i, s in enumerate(samples):
            th = s.main_thread()
            key = (id(th), s.state == "T")
            st = cache.get(key)
            if st is None:
                st = RankState("unread", None) if s.error and th is None else classify_thread(th, funcs)
                if s.state == "T":  # a stopped process is drawn stopped, at the frame it froze in
                    st = RankState("stopped", st.frame)
                if th is not None:
                    cache[key] = st
            nxt = samples[i + 1].t if i + 1 < len(samples) else max(s.t, min(trig, s.t + period))
            if segs and segs[-1].state == st.state and segs[-1].frame == st.frame:
                segs[-1].end = nxt
                segs[-1].samples += 1
            else:
                segs.append(_Seg(s.t, nxt, st.state, st.frame, 1))
        last = samples[-1]
        out.append({"rank": rank, "node": last.node, "pid": last.pid, "title": last.title,
                    "segments": [{"start_s": round(g.start - trig, 3), "end_s": round(g.end - trig, 3),
                                  "state": g.state, "frame": g.frame, "samples": g.samples} for g in segs]})
    return out


def _stacks(rng: random.Random) -> list[StackSample]:
    frames = [Frame("fetch_rows", "/sgl_seat/sim/rowfetch.py", 5), Frame("all_reduce", "/torch/distributed.py", 9),
              Frame("forward", "/sglang/model.py", 10), Frame("select", "/usr/lib/python3.11/selectors.py", 4),
              Frame("run", "/sglang/scheduler.py", 3)]
    shared = [(ThreadStack(1, "MainThread", True, True, tuple(rng.sample(frames, rng.randrange(1, 4)))),)
              for _ in range(4)]
    out = []
    t = T0
    for _ in range(rng.randrange(1, 80)):
        t += rng.choice((0.0, 0.5, 1.0, 1.0, 1.0, 2.5))
        kind = rng.random()
        if kind < 0.08:
            threads: tuple[ThreadStack, ...] = ()
        elif kind < 0.6:
            threads = rng.choice(shared)
        else:  # an equal stack in a tuple of its own, or a helper thread only (no main thread)
            main = rng.random() < 0.8
            threads = (ThreadStack(1 if main else 7, "MainThread" if main else "helper", True, main,
                                   tuple(rng.sample(frames, rng.randrange(0, 3)))),)
        err = "dump failed" if not threads and rng.random() < 0.7 else None
        out.append(StackSample(t, 0, 100 + rng.randrange(2), "sglang::scheduler", rng.choice((0, 1, 2, None)),
                               False, threads, err))
    return out


def test_timeline_run_lengths_are_the_per_sample_segments() -> None:
    funcs = frozenset({"fetch_rows"})
    for seed in range(150):
        rng = random.Random(seed)
        stacks = _stacks(rng)
        trig = T0 + rng.choice((-5.0, 10.0, 40.0, 500.0))
        got = analysis.timeline(SimpleNamespace(stacks=stacks, processes=[]), trig, funcs)  # type: ignore[arg-type]
        assert got == _ref_timeline(stacks, trig, funcs), f"seed {seed}"
