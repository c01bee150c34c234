"""The warning before a hang: a row-fetch tail growing at the largest gather sizes.

Why: the field report's hangs came with variable gather sizes, and the row fetches at the largest gathers
slowed down before one stopped returning. The hang detectors (:mod:`sgl_seat.core.detect`) fire once a fetch
is *late* (``rowfetch_inflight_s``); this one says earlier that the tail is moving, while every fetch still
returns. It is a warning, not a verdict: it never triggers a capture. The sidecar exports it (a gauge
Prometheus alerts on), ``watch`` prints it and ``replay`` finds it in a bundle's probe history, all through
:func:`detect_prehang` over the observation's probe columns (:class:`~sgl_seat.core.columns.ProbeColumns`, live
and in replay; plain :class:`~sgl_seat.core.records.ProbeRecord` lists are accepted too).

The rule, per rank: among that rank's fetches of the last ``recent_s`` seconds, take the ``top_buckets`` largest
gather-size buckets (:func:`~sgl_seat.core.stats.gather_bucket`, the exporter's and the report's buckets) that
also have a baseline: ``min_baseline`` fetches in the ``baseline_s`` before; and smaller ones after them while
the judged buckets hold fewer than ``min_recent`` recent fetches between them (a tail is read from fetches, and
the largest gathers can be rare). Warn when at least ``min_slow`` recent fetches of the judged buckets (a fetch
still in flight counts with its age so far) are each slower than ``ratio`` times its own bucket's baseline p99
and than ``floor_s``. Several slow fetches, not one outlier; a floor, so that microsecond jitter is no trend;
the same bucket, so that a larger gather being slower is no trend either. A bucket without a baseline is skipped,
not judged: a seat that slows down queues requests and gathers more rows than before, and those new, larger
buckets must not push the known ones out of the judgement. Pure: ``now`` is an argument and records after it
are ignored, as in the detectors.

It detects a change: a slow tail that lasts longer than ``recent_s`` enters the baseline, and the warning clears
about ``recent_s`` after it began (sooner if the tail was short). So the shipped Prometheus alert keeps firing
for a while after the gauge drops (``keep_firing_for``), and replay reports the *first* warning before a trigger.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sgl_seat.core.columns import F64, I64, ProbeColumns
from sgl_seat.core.records import ProbeRecord, RecordError
from sgl_seat.core.stats import gather_bucket, gather_bucket_label, percentile

__all__ = ["PREHANG_KIND", "PreHangWarning", "TailReading", "WarningRule", "detect_prehang", "first_warning", "judge",
           "tail_readings"]

#: What the warning is called in `watch`, the exporter's help text and the replay report.
PREHANG_KIND = "row-fetch tail growing"


@dataclass(frozen=True, slots=True, kw_only=True)
class WarningRule:
    """The warning's knobs. Defaults are the shipped rule; :meth:`for_stall` ties the floor to the stall threshold."""

    #: The window whose fetches are judged.
    recent_s: float = 15.0
    #: The window before it that sets each bucket's normal tail.
    baseline_s: float = 45.0
    #: How many of the largest gather buckets seen in the recent window (with a baseline) are judged, at least.
    top_buckets: int = 2
    #: Recent fetches slower than ``ratio`` x the baseline p99 count as slow.
    ratio: float = 4.0
    #: ... and slower than this (seconds): below it a "tail" is jitter.
    floor_s: float = 0.03
    #: Slow recent fetches needed in one bucket of one rank.
    min_slow: int = 3
    #: Completed baseline fetches needed in that bucket for its p99 to mean anything.
    min_baseline: int = 10
    #: Recent fetches the judged buckets must hold together: while the largest hold fewer (large gathers can be
    #: rare), the next smaller bucket is judged too.
    min_recent: int = 20

    @classmethod
    def for_stall(cls, rowfetch_inflight_s: float) -> WarningRule:
        """The shipped rule for a stall threshold: the floor is 1 % of it (30 ms at the default 3 s)."""
        return cls(floor_s=rowfetch_inflight_s / 100.0)


@dataclass(frozen=True, slots=True)
class TailReading:
    """One rank's tail in one gather bucket: recent vs baseline (seconds). ``ratio`` is NaN without a baseline."""

    rank: int
    node: int
    gather_lo: int
    gather_hi: int
    recent_count: int
    recent_p99_s: float
    baseline_count: int
    baseline_p99_s: float
    slow: int
    in_flight: int

    @property
    def gather(self) -> str:
        return gather_bucket_label(self.gather_lo)

    @property
    def ratio(self) -> float:
        if self.baseline_count == 0 or self.baseline_p99_s <= 0.0:
            return math.nan
        return self.recent_p99_s / self.baseline_p99_s


@dataclass(frozen=True, slots=True)
class PreHangWarning:
    """The warning: the rank and gather bucket whose tail grew most, by how much, and why."""

    t: float
    rank: int
    node: int
    gather: str
    recent_p99_s: float
    baseline_p99_s: float
    slow: int
    evidence: tuple[str, ...] = ()

    kind = PREHANG_KIND

    @property
    def ratio(self) -> float:
        return self.recent_p99_s / self.baseline_p99_s if self.baseline_p99_s > 0 else math.inf

    def summary(self) -> str:
        """One line for `watch` and the report."""
        return (f"{PREHANG_KIND}: rank {self.rank} node {self.node} gather {self.gather}, p99 "
                f"{self.recent_p99_s * 1e3:.1f} ms vs {self.baseline_p99_s * 1e3:.1f} ms before "
                f"({self.ratio:.1f}x, {self.slow} slow)")

    def to_json(self) -> dict[str, Any]:
        return {"kind": PREHANG_KIND, "t": self.t, "rank": self.rank, "node": self.node, "gather": self.gather,
                "recent_p99_s": self.recent_p99_s, "baseline_p99_s": self.baseline_p99_s, "slow": self.slow,
                "evidence": list(self.evidence)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreHangWarning:
        try:
            ev = d.get("evidence") or []
            if d.get("kind") != PREHANG_KIND or not all(isinstance(e, str) for e in ev):
                raise RecordError(f"not a {PREHANG_KIND!r} warning")
            return cls(t=float(d["t"]), rank=int(d["rank"]), node=int(d["node"]), gather=str(d["gather"]),
                       recent_p99_s=float(d["recent_p99_s"]), baseline_p99_s=float(d["baseline_p99_s"]),
                       slow=int(d["slow"]), evidence=tuple(ev))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"bad warning: {exc}") from None


@dataclass(frozen=True, slots=True)
class _Rows:
    """The columns the warning reads, with each row's gather bucket (its low end), sorted by start."""

    start: F64
    end: F64
    lo: I64
    rank: I64
    node: I64

    @classmethod
    def of(cls, probes: ProbeColumns | Iterable[ProbeRecord], *, since: float = -math.inf,
           span: float = math.inf) -> _Rows:
        """The rows; with ``since``, only those a window ending at ``since`` or later can read (started within
        ``span`` before it, or lasting longer than ``span``: in flight at a window's end)."""
        cols = probes if isinstance(probes, ProbeColumns) else ProbeColumns.from_records(probes)
        keep = (cols.gather_size >= 0) & (cols.rank >= 0)
        if since > -math.inf:
            keep &= (cols.start >= since - span) | ~(cols.end - cols.start <= span)
        order = np.flatnonzero(keep)
        order = order[np.argsort(cols.start[order], kind="stable")]
        gathers, inv = np.unique(cols.gather_size[order], return_inverse=True)
        los = np.array([gather_bucket(int(g))[0] for g in gathers] or [0], dtype=np.int64)
        return cls(start=cols.start[order], end=cols.end[order], lo=los[inv.reshape(-1)], rank=cols.rank[order],
                   node=cols.node[order])

    def window(self, a: int, b: int, extra: npt.NDArray[np.intp]) -> _Rows:
        idx = np.concatenate([np.arange(a, b, dtype=np.intp), extra])
        return _Rows(self.start[idx], self.end[idx], self.lo[idx], self.rank[idx], self.node[idx])


def _readings(rows: _Rows, now: float, rule: WarningRule) -> list[TailReading]:
    recent_t0 = now - rule.recent_s
    base_t0 = recent_t0 - rule.baseline_s
    started = rows.start <= now
    done = rows.end <= now  # NaN (in flight) compares False
    dur = np.where(done, rows.end, now) - rows.start
    recent = started & (~done | (rows.start >= recent_t0))
    base = started & done & ~recent & (rows.start >= base_t0)
    out: list[TailReading] = []
    for rank in np.unique(rows.rank[recent]).tolist():
        mine = rows.rank == rank
        rec_r = recent & mine
        node = int(rows.node[np.flatnonzero(rec_r)[0]])
        judged = covered = 0
        for lo in sorted(np.unique(rows.lo[rec_r]).tolist(), reverse=True):
            if judged >= rule.top_buckets and covered >= rule.min_recent:
                break
            in_b = rows.lo == lo
            b = dur[base & mine & in_b].tolist()
            if len(b) < rule.min_baseline:
                continue  # no normal to grow from (a larger gather than before): not judged, not counted
            vals = dur[rec_r & in_b]
            judged += 1
            covered += len(vals)
            bp99 = percentile(b, 99)
            limit = max(rule.floor_s, rule.ratio * bp99)
            out.append(TailReading(rank=int(rank), node=node, gather_lo=int(lo), gather_hi=gather_bucket(int(lo))[1],
                                   recent_count=len(vals), recent_p99_s=percentile(vals.tolist(), 99),
                                   baseline_count=len(b), baseline_p99_s=bp99, slow=int(np.sum(vals > limit)),
                                   in_flight=int(np.sum(~done[rec_r & in_b]))))
    return out


def tail_readings(probes: ProbeColumns | Iterable[ProbeRecord], now: float,
                  rule: WarningRule = WarningRule()) -> list[TailReading]:
    """Per rank, the judged gather buckets of its recent fetches (the module doc's rule), largest first."""
    return _readings(_Rows.of(probes), now, rule)


def judge(readings: Sequence[TailReading], now: float, rule: WarningRule = WarningRule()) -> PreHangWarning | None:
    """The warning the readings give under ``rule`` (what :func:`detect_prehang` returns), or None: the rank with
    the most slow fetches over its judged buckets, named at the largest bucket that holds one."""
    by_rank: dict[int, list[TailReading]] = {}
    for r in readings:
        if r.baseline_count >= rule.min_baseline:
            by_rank.setdefault(r.rank, []).append(r)
    cands = []
    for rank, rs in by_rank.items():
        slow = sum(r.slow for r in rs)
        if slow >= rule.min_slow:
            at = max((r for r in rs if r.slow), key=lambda r: r.gather_lo)
            cands.append((slow, at.ratio, -rank, rs, at))
    if not cands:
        return None
    slow, _, _, rs, at = max(cands, key=lambda c: c[:3])
    ev = [f"rank {at.rank}: {slow} of {sum(r.recent_count for r in rs)} fetches at its largest gathers in the last "
          f"{rule.recent_s:.0f}s slower than {rule.ratio:g}x their bucket's p99 over the {rule.baseline_s:.0f}s "
          f"before and than {rule.floor_s * 1e3:.0f} ms"]
    ev += [f"gather {r.gather}: {r.slow} slow of {r.recent_count}, p99 {r.recent_p99_s * 1e3:.2f} ms vs "
           f"{r.baseline_p99_s * 1e3:.2f} ms over {r.baseline_count} fetches before" for r in rs]
    infl = sum(r.in_flight for r in rs)
    if infl:
        ev.append(f"{infl} of them still in flight (counted with their age so far)")
    others = sorted(-c[2] for c in cands if c[3] is not rs)
    if others:
        ev.append("also: " + ", ".join(f"rank {r}" for r in others[:6]))
    return PreHangWarning(t=now, rank=at.rank, node=at.node, gather=at.gather, recent_p99_s=at.recent_p99_s,
                          baseline_p99_s=at.baseline_p99_s, slow=slow, evidence=tuple(ev))


def detect_prehang(probes: ProbeColumns | Iterable[ProbeRecord], now: float,
                   rule: WarningRule = WarningRule()) -> PreHangWarning | None:
    """The warning at ``now``, or None (see :func:`judge`)."""
    return judge(tail_readings(probes, now, rule), now, rule)


def first_warning(probes: ProbeColumns | Iterable[ProbeRecord], t0: float, t1: float, *, step_s: float = 1.0,
                  rule: WarningRule = WarningRule()) -> PreHangWarning | None:
    """The earliest warning when :func:`detect_prehang` is evaluated every ``step_s`` from ``t0`` to ``t1``
    (what a sidecar ticking at that period would have raised first); None if it never fires. Over columns: a
    one-hour bundle's million fetches cost one sort, then each step reads only its window."""
    if step_s <= 0:
        raise ValueError("step_s must be positive")
    span = rule.recent_s + rule.baseline_s
    rows = _Rows.of(probes, since=t0, span=span)
    # A fetch that started before a window yet matters to it is in flight at the window's end: long or unfinished.
    long = np.flatnonzero(~(rows.end - rows.start <= span))
    # A fetch can be slow only if it took (or, unfinished, is taking) longer than the floor: a step whose window
    # holds fewer than min_slow such fetches of any one rank cannot warn, and is skipped without the readings.
    maybe = np.flatnonzero(~(rows.end - rows.start <= rule.floor_s))
    for i in range(max(0, math.floor((t1 - t0) / step_s)) + 1):
        now = t0 + i * step_s
        m = maybe[(rows.start[maybe] <= now - rule.floor_s)
                  & ((rows.start[maybe] >= now - rule.recent_s) | ~(rows.end[maybe] <= now))]
        if len(m) < rule.min_slow or int(np.bincount(rows.rank[m] - rows.rank[m].min()).max()) < rule.min_slow:
            continue
        a = int(np.searchsorted(rows.start, now - span, side="left"))
        b = int(np.searchsorted(rows.start, now, side="right"))
        w = judge(_readings(rows.window(a, b, long[rows.start[long] < now - span]), now, rule), now, rule)
        if w is not None:
            return w
    return None
