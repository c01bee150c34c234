"""Row-fetch stall thresholds learned from the seat's own healthy calls, shared by the live watchdog and replay.

Why: a fixed ``rowfetch_inflight_s`` (3 s) is about 200 times a healthy CPU fetch's p99 and far more on a GPU, and
it is most of the time from a stall to its bundle. Each node learns, per probed target and call shape (a gather
size's power-of-two bucket, or a CUDA graph replay's shape key), the distribution of its healthy calls; a call in
flight is late once its age passes ``max(learn_floor_s, learn_k x the shape's learn_quantile)``. Until a shape has
``learn_min_samples`` healthy calls it borrows the threshold of the nearest larger shape of the same target on the same
node that has them (:meth:`LearnedThresholds.entry_for`), else the fixed threshold holds; the fixed one always holds
for a warm-up call.

A **warm-up call** is one of a process's first ``learn_warmup_calls`` calls of a shape (a new shape compiles or
captures: the first prefill on the CPU engine took 31.7 s), or a process's first call after ``learn_idle_gap_s``
without any probed call (after start-up, after idle, after ``--sleep-on-idle``). Warm-up calls never teach the
distribution and are judged by the fixed threshold, so a slow first call never fires a bundle and never becomes
"the cause".

The live sidecar keeps a :class:`Learner` fed with every completed record; at each detection it hands the
detectors a frozen :class:`LearnedThresholds`, which a capture writes into the bundle's manifest (``learned``), and
``replay`` reads it back, so both judge a call by the same figure. Which calls are warm-up is read from the
records themselves (:func:`row_thresholds`): a pure function of the observation, live and offline alike.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sgl_seat.core.columns import ProbeColumns, is_beat
from sgl_seat.core.records import ProbeRecord
from sgl_seat.core.stats import gather_bucket, gather_bucket_label, rank_index
from sgl_seat.spec import WatchdogSpec

__all__ = ["LearnedEntry", "LearnedThresholds", "Learner", "RowThresholds", "row_thresholds", "shape_key"]

#: Healthy durations kept per node and shape (the newest): enough for a p99.9, small enough to sort every second.
KEEP_PER_SHAPE = 4096
#: A learned ``learned`` manifest value holds at most this many shapes (a reader's bound on untrusted input).
MAX_SHAPES = 4096


def shape_key(node: int, target: str, gather_size: int, graph_key: int | None) -> str:
    """The name a node's learned distribution goes by: ``"<node>|<target>|gather 4-7"`` or ``"...|graph 17"``."""
    shape = f"graph {graph_key}" if graph_key is not None else f"gather {gather_bucket_label(gather_size)}"
    return f"{node}|{target}|{shape}"


def _shape_size(key: str) -> tuple[str, int] | None:
    """(kind, size) of a shape name's last part: ("graph", the shape key) or ("gather", the bucket's low end);
    None for a gather of unknown size."""
    shape = key[key.rfind("|") + 1:]
    kind, _, rest = shape.partition(" ")
    head = rest.split("-", 1)[0]
    if kind not in ("graph", "gather") or not head.isdigit():
        return None
    return kind, int(head)


@dataclass(frozen=True, slots=True)
class LearnedEntry:
    """One shape's learned threshold: ``threshold_s`` from ``quantile_s`` over ``samples`` healthy calls."""

    threshold_s: float
    quantile_s: float
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"threshold_s": self.threshold_s, "quantile_s": self.quantile_s, "samples": self.samples}


def _finite(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"learned.{what}: expected a finite number >= 0")
    return float(v)


@dataclass(frozen=True, slots=True)
class LearnedThresholds:
    """The learned thresholds of one node or (merged at capture) of a seat, with the settings that made them."""

    entries: Mapping[str, LearnedEntry] = field(default_factory=dict)
    floor_s: float = 0.3
    k: float = 8.0
    quantile: float = 99.0
    min_samples: int = 200
    warmup_calls: int = 2
    idle_gap_s: float = 5.0

    @classmethod
    def settings_of(cls, th: WatchdogSpec, entries: Mapping[str, LearnedEntry] | None = None) -> LearnedThresholds:
        return cls(entries=dict(entries or {}), floor_s=th.learn_floor_s, k=th.learn_k, quantile=th.learn_quantile,
                   min_samples=th.learn_min_samples, warmup_calls=th.learn_warmup_calls,
                   idle_gap_s=th.learn_idle_gap_s)

    def merged(self, other: LearnedThresholds) -> LearnedThresholds:
        """Both nodes' shapes (keys carry the node, so they do not collide); this one's settings."""
        return LearnedThresholds(entries={**self.entries, **other.entries}, floor_s=self.floor_s, k=self.k,
                                 quantile=self.quantile, min_samples=self.min_samples,
                                 warmup_calls=self.warmup_calls, idle_gap_s=self.idle_gap_s)

    def entry_for(self, node: int, target: str, gather_size: int,
                  graph_key: int | None) -> tuple[str, LearnedEntry] | None:
        """The learned entry a call of this shape is judged by, with its shape's name: its own shape's where that has
        ``min_samples`` healthy calls, else the nearest larger shape's of the same target on the same node that has
        them (a graph replay of more requests, a gather of a higher bucket), else None (the fixed threshold).

        Why borrow: on one H100 the first of ten stalls of a draft-on decode replay hit a batch shape that had not
        yet had its 200 healthy calls (graph 14, beside graph 16's 2,196), was judged by the fixed 3 s and gave
        its bundle 3.3 s after the stall where the nine others took 0.6-0.8 s
        (``bench/gpu/results/2026-12-06-h100-trained-run2-ngram-faults.json``). The same call at a larger size
        does at least the work of a smaller one, so the larger shape's healthy figure bounds the smaller's from
        above; a shape larger than every learned one, or of an unknown size, has no such bound.
        """
        own = shape_key(node, target, gather_size, graph_key)
        ent = self.entries.get(own)
        if ent is not None and ent.samples >= self.min_samples:
            return own, ent
        mine = _shape_size(own)
        if mine is None:
            return None
        prefix = own[: own.rindex("|") + 1]
        best: tuple[int, str, LearnedEntry] | None = None
        for key, e in self.entries.items():
            if e.samples < self.min_samples or not key.startswith(prefix) or key.find("|", len(prefix)) >= 0:
                continue
            size = _shape_size(key)
            if size is None or size[0] != mine[0] or size[1] < mine[1]:
                continue
            if best is None or (size[1], key) < (best[0], best[1]):
                best = (size[1], key, e)
        return None if best is None else (best[1], best[2])

    def to_json(self) -> dict[str, Any]:
        return {"floor_s": self.floor_s, "k": self.k, "quantile": self.quantile, "min_samples": self.min_samples,
                "warmup_calls": self.warmup_calls, "idle_gap_s": self.idle_gap_s,
                "shapes": {k: e.to_json() for k, e in sorted(self.entries.items())}}

    @classmethod
    def from_json(cls, d: Any) -> LearnedThresholds:
        """Strict: a bundle's ``learned`` is untrusted input (ValueError says what is wrong)."""
        if not isinstance(d, dict):
            raise ValueError("learned: expected an object")
        shapes = d.get("shapes", {})
        if not isinstance(shapes, dict) or len(shapes) > MAX_SHAPES:
            raise ValueError(f"learned.shapes: expected an object of at most {MAX_SHAPES} shapes")
        entries: dict[str, LearnedEntry] = {}
        for key, e in shapes.items():
            if not isinstance(key, str) or len(key) > 300 or not isinstance(e, dict):
                raise ValueError("learned.shapes: expected shape name -> {threshold_s, quantile_s, samples}")
            n = e.get("samples")
            if type(n) is not int or n < 0:
                raise ValueError(f"learned.shapes[{key[:60]!r}].samples: expected an integer >= 0")
            entries[key] = LearnedEntry(_finite(e.get("threshold_s"), "threshold_s"),
                                        _finite(e.get("quantile_s"), "quantile_s"), n)
        calls, mins = d.get("warmup_calls", 2), d.get("min_samples", 200)
        if type(calls) is not int or type(mins) is not int or calls < 0 or mins < 1:
            raise ValueError("learned.warmup_calls / min_samples: expected integers")
        return cls(entries=entries, floor_s=_finite(d.get("floor_s", 0.3), "floor_s"), k=_finite(d.get("k", 8), "k"),
                   quantile=_finite(d.get("quantile", 99), "quantile"), min_samples=mins, warmup_calls=calls,
                   idle_gap_s=_finite(d.get("idle_gap_s", 5), "idle_gap_s"))


class Learner:
    """A node's running distribution of healthy call durations per shape (not thread-safe: one feeder).

    ``observe`` every completed record once, in any order of completion; warm-up calls (see the module doc) are
    counted apart and teach nothing. ``near`` counts the healthy calls that took at least half the threshold they
    were judged by when they ended: how close healthy traffic came to a false bundle.
    """

    def __init__(self, th: WatchdogSpec) -> None:
        self.th = th
        self._durations: dict[str, deque[float]] = {}
        self._seen: dict[tuple[int, str], int] = {}  # (pid, shape) -> calls seen
        self._last_end: dict[int, float] = {}  # pid -> latest end of any of its calls
        self.warmups = 0
        self.unhealthy = 0
        self.learned_calls = 0
        self.near = 0
        self.worst_ratio = 0.0  # the largest duration / threshold of a healthy call
        self._current = LearnedThresholds.settings_of(th)

    def observe(self, records: Iterable[ProbeRecord], *, healthy: bool = True) -> None:
        """Feed completed records. ``healthy`` False (the sidecar is latched on a hang): they update the warm-up
        bookkeeping and teach nothing, and neither does a call that took its threshold or longer. Heartbeats
        (:func:`~sgl_seat.core.columns.is_beat`) are not calls: left out."""
        for r in sorted((r for r in records if r.end is not None and not is_beat(r.target)),
                        key=lambda r: (r.pid, r.start)):
            end = r.end
            assert end is not None
            key = shape_key(r.node, r.target, r.gather_size, r.graph_key)
            seen = self._seen.get((r.pid, key), 0)
            last = self._last_end.get(r.pid)
            self._seen[(r.pid, key)] = seen + 1
            self._last_end[r.pid] = end if last is None else max(last, end)
            if seen < self.th.learn_warmup_calls or last is None or r.start - last > self.th.learn_idle_gap_s:
                self.warmups += 1
                continue
            d = end - r.start
            found = self._current.entry_for(r.node, r.target, r.gather_size, r.graph_key)
            limit = found[1].threshold_s if found is not None else self.th.rowfetch_inflight_s
            if not healthy or d >= limit:  # a hang's calls, or one that was late itself: not healthy traffic
                self.unhealthy += 1
                continue
            self.worst_ratio = max(self.worst_ratio, d / limit)
            if d >= 0.5 * limit:
                self.near += 1
            self._durations.setdefault(key, deque(maxlen=KEEP_PER_SHAPE)).append(d)
            self.learned_calls += 1

    def forget_pids(self, alive: Iterable[int]) -> None:
        """Drop the warm-up bookkeeping of processes that are gone (a restart's new pids warm up anew)."""
        keep = set(alive)
        self._seen = {k: v for k, v in self._seen.items() if k[0] in keep}
        self._last_end = {p: t for p, t in self._last_end.items() if p in keep}

    def threshold_for(self, r: ProbeRecord) -> float:
        """The threshold an in-flight call is judged by now, from this learner's own bookkeeping (the sidecar's
        fast check; the detectors decide from the records, :func:`row_thresholds`)."""
        key = shape_key(r.node, r.target, r.gather_size, r.graph_key)
        found = self._current.entry_for(r.node, r.target, r.gather_size, r.graph_key)
        last = self._last_end.get(r.pid)
        if (found is None or last is None or r.start - last > self.th.learn_idle_gap_s
                or self._seen.get((r.pid, key), 0) < self.th.learn_warmup_calls):
            return self.th.rowfetch_inflight_s
        return found[1].threshold_s

    def thresholds(self) -> LearnedThresholds:
        """The current thresholds (recomputed from the kept durations; also what ``near`` is judged by next)."""
        th = self.th
        entries: dict[str, LearnedEntry] = {}
        if th.learn_enabled:
            for key, ds in self._durations.items():
                if len(ds) < th.learn_min_samples:
                    continue
                arr = np.sort(np.fromiter(ds, dtype=np.float64, count=len(ds)))
                q = float(arr[rank_index(len(arr), th.learn_quantile)])
                entries[key] = LearnedEntry(max(th.learn_floor_s, th.learn_k * q), q, len(arr))
        self._current = LearnedThresholds.settings_of(th, entries)
        return self._current

    def stats(self) -> dict[str, Any]:
        return {"learned_calls": self.learned_calls, "warmup_calls": self.warmups, "unhealthy_calls": self.unhealthy,
                "near_misses": self.near,
                "worst_ratio": round(self.worst_ratio, 4),
                "shapes": {k: e.to_json() for k, e in sorted(self._current.entries.items())}}


@dataclass(frozen=True, slots=True)
class RowThresholds:
    """Per probe row, the threshold it is judged by and why: ``learned`` the shape's entry applied, ``warmup`` a
    warm-up call (fixed threshold), else the fixed threshold because its shape has too few samples."""

    seconds: npt.NDArray[np.float64]
    learned: npt.NDArray[np.bool_]
    warmup: npt.NDArray[np.bool_]
    #: Rows judged by another shape's learned threshold (:meth:`LearnedThresholds.entry_for`): row -> that shape.
    borrowed: Mapping[int, str] = field(default_factory=dict)


def row_thresholds(pc: ProbeColumns, learned: LearnedThresholds | None, fixed: float, now: float) -> RowThresholds:
    """Each in-flight row's threshold at ``now`` (rows not in flight get ``fixed``; they cannot be late).

    A row is a warm-up call when its process made fewer than ``warmup_calls`` calls of its shape before it, or its
    process's previous call ended more than ``idle_gap_s`` before it began (or there is none in the records).
    """
    n = len(pc)
    sec = np.full(n, fixed, dtype=np.float64)
    lrn = np.zeros(n, dtype=np.bool_)
    warm = np.zeros(n, dtype=np.bool_)
    if learned is None or not learned.entries or n == 0:
        return RowThresholds(sec, lrn, warm)
    live = np.flatnonzero(pc.in_flight_at(now) | pc.gpu_in_flight_at(now))
    borrowed: dict[int, str] = {}
    for i in live.tolist():
        r = pc.record(i)
        found = learned.entry_for(r.node, r.target, r.gather_size, r.graph_key)
        if found is None:
            continue
        key, ent = found
        mine = np.flatnonzero((pc.pid == r.pid) & ~np.isnan(pc.end) & (pc.end <= r.start) & (pc.start < r.start))
        if not mine.size or r.start - float(np.max(pc.end[mine])) > learned.idle_gap_s:
            warm[i] = True
            continue
        if learned.warmup_calls:
            lo, hi = gather_bucket(r.gather_size)
            same = mine[(pc.gather_size[mine] >= lo) & (pc.gather_size[mine] <= hi) if r.graph_key is None
                        else np.fromiter((pc.record(j).graph_key == r.graph_key for j in mine.tolist()),
                                         dtype=np.bool_, count=mine.size)]
            same = same[pc.target_is(r.target)[same]]
            if same.size < learned.warmup_calls:
                warm[i] = True
                continue
        sec[i] = ent.threshold_s
        lrn[i] = True
        if key != shape_key(r.node, r.target, r.gather_size, r.graph_key):
            borrowed[i] = key
    return RowThresholds(sec, lrn, warm, borrowed)
