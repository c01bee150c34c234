"""Offline diagnosis of a loaded bundle: where each rank was, who lags, and what the row fetches did.

Pure functions over a :class:`~sgl_seat.forensics.format.bundle.Bundle` (no I/O), so the same analysis runs on
a golden bundle in a unit test and on a one-hour bundle in the bench. The pieces answer the questions an
operator asks of a hang, in order: which rank lags and where (divergence: ranks waiting in a collective vs
one elsewhere), how long each thread had been stuck, what each rank did over time (timeline), whether row
fetches slowed with gather size (latency by power-of-two bucket, the live exporter's buckets too, the in-flight
fetch highlighted), and what the seat was doing before the trigger (running requests, throughput, accept
length).

Times in the report are seconds relative to the trigger (negative = before it), so reports compare across
bundles and golden files stay stable.

One module of about 440 lines on purpose: it is one thing, the report's analysis. Each section is one
function over the same bundle, with the same time base and rounding; splitting it would spread those
conventions over several files.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sgl_seat.core.columns import F64, I64, Mask, ProbeColumns, is_beat
from sgl_seat.core.frames import (
    REHEARSAL_GATE_FILE,
    collective_frame,
    idle_frame,
    is_stdlib,
    python_frames,
    short_name,
    stuck_frame,
    target_qualname,
)
from sgl_seat.core.learned import LearnedThresholds, row_thresholds
from sgl_seat.core.nodeloss import missing_nodes, names
from sgl_seat.core.records import Frame, MetricsPoint, StackSample, ThreadStack
from sgl_seat.core.stats import gather_bucket, percentile, rank_index
from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.forensics.format.bundle import Bundle
from sgl_seat.forensics.format.extras import words_of
from sgl_seat.forensics.format.request_table import RequestTable
from sgl_seat.forensics.replay.redetect import learned_of, thresholds_of

__all__ = [
    "Analysis",
    "RankState",
    "analyse",
    "classify_thread",
    "rowfetch_buckets",
    "warmup_rows",
]

#: Row-fetch functions recognised even without probe records naming them.
ROWFETCH_FUNCS = frozenset({"fetch_rows"})

#: Calls per (process, target, graph shape) that count as warm-up when the bundle holds the process's first call.
WARMUP_CALLS = 2
MAX_STUCK = 20
STUCK_MIN_SAMPLES = 3
ACTIVITY_WINDOW_S = 60.0


def warmup_rows(pt: ProbeColumns) -> Mask:
    """The rows that are warm-up calls: each (process, target, graph shape)'s first :data:`WARMUP_CALLS` calls, of
    the processes whose first call (call number 1) the bundle holds (a ring that wrapped holds none)."""
    out = np.zeros(len(pt), np.bool_)
    if not len(pt):
        return out
    pids = np.array([g.pid for g in pt.groups], np.int64)[pt.group]
    from_start = [int(p) for p in np.unique(pids) if int(pt.seq[pids == p].min()) == 1]
    if not from_start:  # the usual bundle: its ring has wrapped since each process's first calls
        return out
    # Columnar (a bundle holds up to a million records): the rows of those processes in (key, call number) order,
    # and each key's first WARMUP_CALLS of them.
    keys: dict[tuple[int, str, int | None], int] = {}
    key_of_group = np.array([keys.setdefault((g.pid, g.target, g.graph_key), len(keys)) for g in pt.groups],
                            np.int64)
    idx = np.flatnonzero(np.isin(pids, from_start))
    ranks = np.array([g.rank for g in pt.groups], np.int64)[pt.group[idx]]
    ends = np.where(np.isnan(pt.end[idx]), np.inf, pt.end[idx])  # call numbers are unique per process: the rest
    order = idx[np.lexsort((ranks, pt.gather_size[idx], ends, pt.start[idx], pt.seq[idx],  # only orders ties
                            key_of_group[pt.group[idx]]))]
    k = key_of_group[pt.group[order]]
    pos = np.arange(len(k))
    run_start = np.maximum.accumulate(np.where(np.r_[True, k[1:] != k[:-1]], pos, 0))
    out[order[pos - run_start < WARMUP_CALLS]] = True
    return out


@dataclass(frozen=True, slots=True)
class RankState:
    """One thread's classification: ``state`` is rowfetch, collective, running, idle, exited or error (no stack);
    the timeline adds stopped and unread (a failed dump: ``_state_codes``)."""

    state: str
    frame: str | None


def classify_thread(th: ThreadStack | None, rowfetch_funcs: frozenset[str] = ROWFETCH_FUNCS) -> RankState:
    """Where a thread is: in a row fetch, waiting in a collective, idle, or running, and on which frame.

    Built on the watchdog's own frame helpers (``collective_frame``, ``stuck_frame``), so "waiting in a
    collective" and "the frame to name" mean here exactly what they mean to the live detectors. "Idle" is
    a thread whose innermost engine-relevant frame is standard library (an event loop in ``select``): such
    a thread says nothing about a hang. A scheduler blocked in ``Condition.wait`` inside engine code is not
    idle: it is named at its engine frame, which is where it is stuck.
    """
    if th is None or not th.frames:
        return RankState("error", None)
    py = python_frames(th)
    coll = collective_frame(th)
    for f in py:
        if _is_rowfetch(f, rowfetch_funcs):
            pos = {id(x): i for i, x in enumerate(th.frames)}
            if coll is None or pos[id(coll)] > pos[id(f)]:
                return RankState("rowfetch", f.label)
            break  # a collective inside the probed call (its TP all-reduce): waiting for the peers, as live
    if coll is not None:
        # Name the Python call site: the collective itself where it is a Python frame, else its nearest caller.
        py_coll = collective_frame(ThreadStack(th.thread_id, th.name, th.active, th.owns_gil, tuple(py)))
        label = py_coll.label if py_coll is not None else next(
            (p.label for p in th.frames[th.frames.index(coll):] if not p.native), coll.label)
        return RankState("collective", label)
    frame = stuck_frame(th)
    if frame is None:
        return RankState("running" if th.active else "idle", th.frames[0].label)
    idle = idle_frame(th)
    if idle is not None:
        return RankState("idle", idle.label)
    if is_stdlib(frame):
        return RankState("idle", frame.label)
    return RankState("running", frame.label)


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _latency_stats(vals: F64) -> dict[str, float | int]:
    """Count, p50, p99 and max (ms) of a latency column (nearest rank, as :func:`~sgl_seat.core.stats.percentile`)."""
    n = len(vals)
    if not n:
        return {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    # A full sort: numpy's vectorised sort beats np.partition with three order statistics (which selects them one
    # after another) by ~3x on a bucket of 100,000 latencies.
    s = np.sort(vals)
    return {"count": n, "p50_ms": _r(s[rank_index(n, 50)]), "p99_ms": _r(s[rank_index(n, 99)]), "max_ms": _r(s[-1])}


#: Integers below this convert to float64 exactly (2**53).
_EXACT_FLOAT_INT = 1 << 53


def _bucket_keys(gather: I64) -> I64:
    """Per record, one int per :func:`~sgl_seat.core.stats.gather_bucket`: the gather size's bit length (0 for 0),
    -1 where the size is unknown (negative)."""
    x = np.where(gather > 0, gather, 0)
    if len(x) and int(x.max()) >= _EXACT_FLOAT_INT:  # a float would round it: one pass per bit of the largest size
        keys = np.zeros(len(gather), np.int64)
        while x.any():
            keys += x > 0
            x >>= 1
    else:  # x = m * 2**e with 0.5 <= m < 1: e is the bit length (frexp(0) gives 0); one pass, not one per bit
        keys = np.frexp(x.astype(np.float64))[1].astype(np.int64)
    keys[gather < 0] = -1
    return keys


def _latencies_ms(pt: ProbeColumns, now: float) -> tuple[F64, Mask]:
    """Per record, its latency in ms (its age at ``now`` while in flight; never negative), and the in-flight mask."""
    fl = np.isnan(pt.end)
    d = (np.where(fl, now, pt.end) - pt.start) * 1000.0
    return np.where(d < 0.0, 0.0, d), fl


def _split_by(vals: F64, key: I64, n: int) -> list[F64]:
    """``vals`` split by ``key`` (small non-negative ints below ``n``): part k holds the values whose key is k.

    One stable sort by the key (a radix sort where the keys fit 16 bits) and one gather, then slices: a boolean
    mask per key cost a pass and a gather over the million rows for each of the ~10 buckets and 8 ranks.
    """
    order = np.argsort(key.astype(np.uint16) if n <= 1 << 16 else key, kind="stable")
    return np.split(vals[order], np.cumsum(np.bincount(key, minlength=n))[:-1])


def _by_rank(pt: ProbeColumns, d: F64) -> list[dict[str, Any]]:
    """Latency stats per rank that rows name, ascending (ranks taken from the groups, not from a million rows)."""
    ranks = sorted({pt.groups[i].rank for i in np.flatnonzero(np.bincount(pt.group, minlength=len(pt.groups)))})
    index = {r: i for i, r in enumerate(ranks)}
    of_group = np.array([index.get(g.rank, 0) for g in pt.groups] or [0], np.int64)
    parts = _split_by(d, of_group[pt.group], len(ranks))
    return [{"rank": r, **_latency_stats(parts[i])} for i, r in enumerate(ranks)]


def _graph_latencies_ms(pt: ProbeColumns, now: float) -> tuple[F64, Mask]:
    """Per graph-replay record, its latency in ms and whether it is in flight at ``now``.

    A replay's host call only launches the graph (microseconds): what took long is its work on the stream,
    timed by its CUDA events (graph.py). So where the record has GPU times the latency is the GPU
    work's (its age so far while in flight on the GPU), else the host call's; in flight is either."""
    host_fl = np.isnan(pt.end)
    gpu_fl = pt.gpu_in_flight_at(now)
    has_gpu = pt.gpu & ~np.isnan(pt.gpu_start)
    gpu_d = np.where(np.isnan(pt.gpu_end) | (pt.gpu_end > now), now, pt.gpu_end) - pt.gpu_start
    host_d = np.where(host_fl, now, pt.end) - pt.start
    d = np.where(has_gpu, gpu_d, host_d) * 1000.0
    return np.where(d < 0.0, 0.0, d), host_fl | gpu_fl


def _bucket_rows(pt: ProbeColumns, d: F64, fl: Mask, stall_ms: float, apart: Mask) -> list[dict[str, Any]]:
    """Latency stats by power-of-two gather-size bucket over these rows (with their latencies and in-flight mask),
    leaving out the rows ``apart`` (completed warm-up calls: counted per bucket in ``warmup``, listed apart)."""
    keys = _bucket_keys(pt.gather_size) + 1  # 0: unknown size, else the size's bit length + 1
    buckets = []
    n_keys = int(keys.max()) + 1 if len(keys) else 0
    kept = ~apart
    parts = _split_by(d[kept], keys[kept], n_keys)
    infl_by_key = np.bincount(keys[np.flatnonzero(fl & kept)], minlength=n_keys)
    warm_by_key = np.bincount(keys[np.flatnonzero(apart)], minlength=n_keys)
    for k in np.flatnonzero(np.bincount(keys, minlength=n_keys)).tolist():  # the keys present, ascending
        b = k - 1
        lo, hi = gather_bucket(-1 if b < 0 else 0 if b == 0 else 1 << (b - 1))
        st = _latency_stats(parts[k])
        n_infl = int(infl_by_key[k])
        buckets.append({"gather_size_min": lo, "gather_size_max": hi, **st, "in_flight": n_infl,
                        "stalled": st["max_ms"] >= stall_ms and n_infl > 0, "warmup": int(warm_by_key[k])})
    return buckets


def _threshold_doc(stall_s: float, learned: LearnedThresholds | None) -> dict[str, Any]:
    """The thresholds the calls were judged by: the fixed one, and the learned ones where the bundle has them."""
    ths = [] if learned is None else sorted(e.threshold_s for e in learned.entries.values()
                                            if e.samples >= learned.min_samples)
    return {"fixed_s": _r(stall_s), "learned_shapes": len(ths),
            "learned_min_s": _r(ths[0]) if ths else None, "learned_max_s": _r(ths[-1]) if ths else None}


def rowfetch_buckets(bundle: Bundle, now: float, *, stall_s: float, learned: LearnedThresholds | None = None,
                     verdict_t: float | None = None) -> dict[str, Any]:
    """Row-fetch latency by gather-size bucket, per rank, and the in-flight fetches (age at ``now``).

    In-flight fetches count in their bucket with their age so far: a stalled fetch is exactly where
    latency "explodes", and leaving it out would hide the hang behind healthy percentiles. Computed over
    the probe columns (a one-hour bundle holds a million records). Completed warm-up calls (:func:`warmup_rows`)
    are left out of the statistics (each bucket counts them in ``warmup``): a first call that compiled is no
    latency of that bucket.

    CUDA graph replays (records with a shape key: SGLang's decode and verify, where the host-table read is a
    kernel inside the graph) are tabled apart, in ``graph_buckets`` by the replayed graph's token count, beside the
    eager fetches' ``buckets``: a replay times a whole step's GPU work, not one gather, so mixing the two would
    blur both. A replay in flight on the GPU (its end event not completed) is listed with the in-flight fetches.
    The keys ``graph_*`` are there only when the bundle has graph replays.
    An in-flight fetch is stalled past its own threshold: the one the detectors judge it by (learned from its
    shape's healthy calls, ``learned``; else ``stall_s``), and a bucket holding one is stalled too. Each in-flight
    fetch says that threshold and where it came from, and its age at ``verdict_t`` too (the verdict's evaluation
    time, where the verdict's evidence timed it), beside its age at ``now`` (the trigger).
    """
    pt = bundle.probes.calls()  # heartbeats are not timed calls
    stall_ms = stall_s * 1000.0
    own = row_thresholds(pt, learned, stall_s, now)
    limit = {(int(pt.pid[i]), int(pt.seq[i])): float(own.seconds[i]) for i in np.flatnonzero(own.learned).tolist()}
    warm_call = {(int(pt.pid[i]), int(pt.seq[i])) for i in np.flatnonzero(own.warmup).tolist()}
    lent = {(int(pt.pid[i]), int(pt.seq[i])): key.rsplit("|", 1)[-1] for i, key in own.borrowed.items()}
    apart_all = warmup_rows(pt) & ~np.isnan(pt.end)
    graph = pt.graph_rows() if len(pt) else np.zeros(0, np.bool_)
    has_graph = bool(graph.any())
    eager = pt.take(~graph) if has_graph else pt
    apart = apart_all[~graph] if has_graph else apart_all
    d, fl = _latencies_ms(eager, now)
    inflight = np.flatnonzero(fl)
    buckets = _bucket_rows(eager, d, fl, stall_ms, apart)
    keyed: list[tuple[tuple[float, int], dict[str, Any]]] = []

    def judged(pid: int, seq: int, t0: float, age: float) -> dict[str, Any]:
        th = limit.get((pid, seq), stall_s)
        how = (f"learned: the nearest larger shape's, {lent[(pid, seq)]}" if (pid, seq) in lent else "learned") \
            if (pid, seq) in limit else "fixed: a warm-up call" if (pid, seq) in warm_call else "fixed"
        return {"stalled": age >= th, "threshold_s": _r(th), "threshold_from": how,
                **({} if verdict_t is None else {"age_at_verdict_ms": _r(max(0.0, verdict_t - t0) * 1000.0),
                                                  "verdict_after_s": _r(verdict_t - now)})}

    for i in inflight.tolist():
        r = eager.record(i)
        age = max(0.0, now - r.start)
        keyed.append(((-age, r.rank), {"rank": r.rank, "node": r.node, "pid": r.pid, "thread": r.thread, "seq": r.seq,
                         "target": r.target, "gather_size": r.gather_size, "start_s": _r(r.start - now),
                         "age_ms": _r(age * 1000.0), **judged(r.pid, r.seq, r.start, age)}))
    out_graph: dict[str, Any] = {}
    kept = ~apart_all
    by_rank_pt, by_rank_d = eager.take(~apart), d[~apart]
    if has_graph:
        gp = pt.take(graph)
        gd, gfl = _graph_latencies_ms(gp, now)
        gbuckets = _bucket_rows(gp, gd, gfl, stall_ms, apart_all[graph])
        for b in gbuckets:  # which captured shapes replayed in each token bucket
            rows = (gp.gather_size >= b["gather_size_min"]) & (gp.gather_size <= b["gather_size_max"]) \
                if b["gather_size_min"] >= 0 else gp.gather_size < 0
            b["shape_keys"] = sorted({k for g in np.unique(gp.group[rows]).tolist()
                                      if (k := gp.groups[g].graph_key) is not None})
        for i in np.flatnonzero(gfl).tolist():
            r = gp.record(i)
            on_gpu = r.end is not None
            t0 = r.gpu_start if on_gpu and r.gpu_start is not None else r.start
            age = max(0.0, now - t0)
            keyed.append(((-age, r.rank), {"rank": r.rank, "node": r.node, "pid": r.pid, "thread": r.thread,
                                           "seq": r.seq, "target": r.target, "gather_size": r.gather_size,
                                           "start_s": _r(t0 - now), "age_ms": _r(age * 1000.0),
                                           **judged(r.pid, r.seq, t0, age),
                                           "graph_key": r.graph_key,
                                           "on_gpu": on_gpu}))
        out_graph = {"graph_replays": len(gp), "graph_in_flight": int(gfl.sum()), "graph_buckets": gbuckets}
        all_d = np.empty(len(pt))
        all_d[np.flatnonzero(~graph)] = d
        all_d[np.flatnonzero(graph)] = gd
        by_rank_pt, by_rank_d = pt.take(kept), all_d[kept]
    keyed.sort(key=lambda kv: kv[0])
    stalled = [doc for _, doc in keyed]
    for b in buckets + out_graph.get("graph_buckets", []):
        graph_b = "shape_keys" in b
        b["stalled"] = b["stalled"] or any(
            doc["stalled"] and ("graph_key" in doc) == graph_b
            and b["gather_size_min"] <= doc["gather_size"] <= b["gather_size_max"] for doc in stalled)
    worst = max(buckets + out_graph.get("graph_buckets", []), key=lambda b: (b["max_ms"], -b["gather_size_min"]),
                default=None)
    return {
        "records": len(pt),
        "completed": len(pt) - int(np.isnan(pt.end).sum()) if has_graph else len(pt) - len(inflight),
        "in_flight": int(np.isnan(pt.end).sum()) if has_graph else len(inflight),
        "stall_threshold_ms": _r(stall_ms),
        "thresholds": _threshold_doc(stall_s, learned),
        "warmup_apart": int(apart_all.sum()),
        "buckets": buckets,
        "worst_bucket": None if worst is None else {"gather_size_min": worst["gather_size_min"],
                                                    "gather_size_max": worst["gather_size_max"],
                                                    "max_ms": worst["max_ms"], "p99_ms": worst["p99_ms"],
                                                    **({"graph": True} if "shape_keys" in worst else {})},
        "by_rank": _by_rank(by_rank_pt, by_rank_d),
        "in_flight_fetches": stalled[:50],
        **out_graph,
    }


def rowfetch_scatter(bundle: Bundle, now: float, *,
                     limit: int = 4000) -> list[tuple[int, float, bool, bool, int, int]]:
    """(gather size, latency ms, in flight, warm-up call, pid, call number) points for the HTML scatter plot,
    evenly thinned to ``limit`` (never an in-flight call or a warm-up call thinned away)."""
    pt = bundle.probes.calls()  # heartbeats are not timed calls
    n = len(pt)
    step = max(1, n // limit)
    d, fl = _latencies_ms(pt, now)
    warm = warmup_rows(pt) & ~fl
    rows = np.arange(0, n, step)
    rows = np.concatenate([rows, np.flatnonzero((fl | warm) & (np.arange(n) % step != 0))])
    return list(zip(pt.gather_size[rows].tolist(), d[rows].tolist(), fl[rows].tolist(), warm[rows].tolist(),
                    pt.pid[rows].tolist(), pt.seq[rows].tolist(), strict=True))


# ---- stacks ------------------------------------------------------------------------------------


def _rowfetch_funcs(bundle: Bundle) -> frozenset[str]:
    """Qualified names of the probe targets (``pkg.mod:Class.method`` -> ``Class.method``; ``pkg.mod.func`` ->
    ``func``), as the detectors derive them (:func:`~sgl_seat.core.frames.target_qualname`)."""
    return ROWFETCH_FUNCS | {target_qualname(g.target)[1] for g in bundle.probes.groups if not is_beat(g.target)}


def _is_rowfetch(f: Frame, funcs: frozenset[str]) -> bool:
    """``f`` is a call of one of ``funcs`` (qualified names): a method by its qualified name (every layer has a
    ``forward``), a plain function by its name."""
    if f.filename.startswith(REHEARSAL_GATE_FILE):  # a rehearsal stall, at the entry of the call it gates
        return any(f.filename == f"{REHEARSAL_GATE_FILE}{q!r}>" for q in funcs)
    return any(f.name == q or f.name.endswith("." + q) or ("." not in q and short_name(f) == q) for q in funcs)


def _rank_samples(samples: Iterable[StackSample]) -> dict[int, list[StackSample]]:
    out: dict[int, list[StackSample]] = defaultdict(list)
    for s in samples:
        if s.rank is not None:
            out[s.rank].append(s)
    for v in out.values():
        v.sort(key=lambda s: s.t)
    return out


def _state_codes(samples: Sequence[StackSample], funcs: frozenset[str],
                 stopped_since: dict[tuple[int, int], float]) -> tuple[I64, list[RankState]]:
    """Per sample, the index of its main thread's state in the returned list of distinct (state, frame) pairs.

    A process seen stopped (the sample's ``/proc`` state ``T``, or at or after the time the sidecar's ``/proc`` reads
    first saw it stopped, ``stopped_since``) is "stopped", at the frame it froze in where its stack was read: a
    stopped rank is never drawn running or waiting. A dump that failed otherwise is "unread" (the sampler could not
    read that stack: no state of the rank, and no fault of it).

    A sample's threads tuple is shared by every sample decoded from the same text (``codec``), so a classification
    is looked up by that tuple's identity: one dictionary hit per sample, not a main-thread search."""
    codes = np.empty(len(samples), np.int64)
    by_threads: dict[tuple[int, bool], int] = {}
    index: dict[tuple[str, str | None], int] = {}
    for i, s in enumerate(samples):
        since = stopped_since.get((s.node, s.pid))
        stopped = s.state == "T" or (since is not None and s.t >= since)
        code = by_threads.get((id(s.threads), stopped))
        if code is None:
            th = s.main_thread()
            st = RankState("unread", None) if s.error and th is None else classify_thread(th, funcs)
            if stopped:
                st = RankState("stopped", st.frame)
            code = index.setdefault((st.state, st.frame), len(index))
            if th is not None:  # a failed dump's state depends on its error too: not shared by its threads
                by_threads[(id(s.threads), stopped)] = code
        codes[i] = code
    return codes, [RankState(state, frame) for state, frame in index]


def timeline(bundle: Bundle, trig: float, funcs: frozenset[str]) -> list[dict[str, Any]]:
    """Per rank, consecutive samples in the same state on the same frame merged into segments.

    A segment runs from its first sample to the next segment's first sample; the last sample lasts one sampling
    period (the median gap), up to the trigger. A rank whose process exited ends with an "exited" segment from
    there to the trigger (or one period, where its last sample is at the trigger or after). Computed as run lengths
    over the per-sample state codes (an hour is 3,600 samples per rank)."""
    out = []
    stopped_since = {(p.node, p.pid): p.stopped_since for p in bundle.processes if p.stopped_since is not None}
    dead = {(p.node, p.pid) for p in bundle.processes if not p.alive}
    for rank, samples in sorted(_rank_samples(bundle.stacks).items()):
        codes, states = _state_codes(samples, funcs, stopped_since)
        t = np.array([s.t for s in samples], np.float64)
        gaps = np.diff(t)
        gaps = np.sort(gaps[gaps > 0])
        period = float(gaps[len(gaps) // 2]) if len(gaps) else 1.0
        first = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))  # each segment's first sample
        after = [*first[1:].tolist(), len(samples)]
        last = samples[-1]
        ends = [*t[first[1:]].tolist(), max(last.t, min(trig, last.t + period))]
        segs = [{"start_s": _r(t[a] - trig), "end_s": _r(e - trig), "state": states[codes[a]].state,
                 "frame": states[codes[a]].frame, "samples": b - a}
                for a, b, e in zip(first.tolist(), after, ends, strict=True)]
        if (last.node, last.pid) in dead:
            gone = max(ends[-1], trig)
            segs.append({"start_s": _r(ends[-1] - trig), "end_s": _r((gone if gone > ends[-1] else gone + period)
                                                                     - trig),
                         "state": "exited", "frame": states[codes[first[-1]]].frame, "samples": 0})
        out.append({"rank": rank, "node": last.node, "pid": last.pid, "title": last.title, "segments": segs})
    return out


def stuck_threads(bundle: Bundle, trig: float, funcs: frozenset[str]) -> list[dict[str, Any]]:
    """Threads whose stack did not change over their last samples: scheduler ranks first, longest first.

    Only a main thread or an active thread counts, and not one parked idle (an event loop in select,
    a helper in a condition wait): those are "unchanged" forever and say nothing about the hang.
    """
    by_thread: dict[tuple[int, int, int], list[tuple[float, ThreadStack, StackSample]]] = defaultdict(list)
    for s in bundle.stacks:
        main = s.main_thread()
        for th in s.threads:
            if th is main or th.active:
                by_thread[(s.node, s.pid, th.thread_id)].append((s.t, th, s))
    out: list[tuple[tuple[bool, float, int, int, int], dict[str, Any]]] = []
    for (node, pid, tid), rows in by_thread.items():
        rows.sort(key=lambda r: r[0])
        last_t, last_th, last_s = rows[-1]
        sig = last_th.signature()
        n = 1
        first_t = last_t
        for t, th, _s in reversed(rows[:-1]):
            if th is not last_th and th.signature() != sig:
                break
            n += 1
            first_t = t
        if n < STUCK_MIN_SAMPLES:
            continue
        if last_s.rank is None and not any(th.active for _t, th, _s in rows[-n:]):
            continue  # no rank's, and idle in every unchanged sample (py-spy): a launcher or loop waiting for work
        st = classify_thread(last_th, funcs)
        if st.state == "idle":
            continue
        if last_s.rank is None and st.state == "collective":
            st = RankState("waiting", st.frame)  # a detokenizer or server in recv(): waiting for work, not peers
        key = (last_s.rank is None, first_t - last_t, last_s.rank if last_s.rank is not None else 1 << 30, pid, tid)
        out.append((key, {"rank": last_s.rank, "node": node, "pid": pid, "title": last_s.title, "thread_id": tid,
                          "thread": last_th.name, "state": st.state, "frame": st.frame,
                          "since_s": _r(first_t - trig), "duration_s": _r(last_t - first_t), "samples": n}))
    out.sort(key=lambda kv: kv[0])
    return [d for _, d in out[:MAX_STUCK]]


def divergence(bundle: Bundle, trig: float, funcs: frozenset[str]) -> dict[str, Any]:
    """Each rank's state at the trigger (:func:`_divergence`), never claiming "every rank" over part of the seat.

    When nodes are missing from the bundle (unreachable at capture), the summary names them and their ranks:
    ranks seen waiting in a collective may be waiting for exactly those.
    """
    out = _divergence(bundle, trig, funcs)
    rank_nodes = bundle.manifest.rank_nodes
    lost = missing_nodes(rank_nodes, bundle.manifest.nodes)
    if lost:
        unseen = sorted(r for r, n in rank_nodes.items() if n in set(lost))
        gone = f"node{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} ({names(unseen)}) missing from" \
               " this bundle (unreachable at capture)"
        if out["waiting"] and not out["lagging"]:
            out["summary"] = f"{names(out['waiting'])} wait in a collective; {gone}: the ranks there are unseen"
        else:
            out["summary"] = f"{out['summary']}; {gone}"
        out["missing_nodes"] = lost
        out["missing_ranks"] = unseen
    return out


def lagging_where(ranks: Sequence[dict[str, Any]], lagging: Sequence[int]) -> str:
    """The lagging ranks' states and frames, as the divergence summary says them."""
    return "; ".join(f"rank {r['rank']} {r['state']}" + (f" at {r['frame']}" if r["frame"] else "")
                     for r in ranks if r["rank"] in lagging)


def _divergence(bundle: Bundle, trig: float, funcs: frozenset[str]) -> dict[str, Any]:
    """Each rank's state at the trigger: who waits in a collective, who is elsewhere (the lagging ranks).

    A rank whose process exited is "exited" (its frame is the last one seen), so a crash reads as the
    survivors waiting for the dead rank rather than as a rank lagging in its last sampled frame.

    The capture-time native stack is the freshest view of a rank; the last Python sample at or before
    the trigger stands in where no native stack was captured.
    """
    latest: dict[int, tuple[StackSample, str]] = {}
    for rank, samples in _rank_samples(bundle.stacks).items():
        before = [s for s in samples if s.t <= trig + 1e-9] or samples
        latest[rank] = (before[-1], "history")
    for rank, samples in _rank_samples(bundle.native_stacks).items():
        best = max(samples, key=lambda s: (s.native and not s.error, s.t))  # a native dump beats a Python one
        latest[rank] = (best, "native" if best.native else "capture")
    dead = {p.rank: p for p in bundle.processes if not p.alive and p.rank is not None}
    ranks: list[dict[str, Any]] = []
    for rank in sorted(latest.keys() | dead.keys()):
        if rank not in latest:
            p = dead[rank]
            ranks.append({"rank": rank, "node": p.node, "pid": p.pid, "state": "exited", "frame": None,
                          "source": "processes", "t_s": None})
            continue
        s, src = latest[rank]
        st = RankState("error", None) if s.error and not s.threads else classify_thread(s.main_thread(), funcs)
        if rank in dead:
            st, src = RankState("exited", st.frame), f"{src}, then exited"
        ranks.append({"rank": rank, "node": s.node, "pid": s.pid, "state": st.state, "frame": st.frame,
                      "source": src, "t_s": _r(s.t - trig)})
    waiting = [r["rank"] for r in ranks if r["state"] == "collective"]
    elsewhere = [r["rank"] for r in ranks if r["state"] != "collective"]
    lagging = elsewhere if waiting and elsewhere else []
    exited = [r["rank"] for r in ranks if r["state"] == "exited"]
    if lagging:
        summary = f"{names(waiting)} wait in a collective; lagging: {lagging_where(ranks, lagging)}"
        if exited:
            summary += f" ({names(exited)} exited: the survivors wait for a peer that is gone)"
    elif waiting:
        summary = "every rank waits in a collective: a mismatched or lost collective, not a lagging rank"
    elif ranks:
        summary = "no rank waits in a collective"
    else:
        summary = "no stack samples in the bundle"
    return {"ranks": ranks, "waiting": waiting, "elsewhere": elsewhere, "lagging": lagging, "summary": summary}


# ---- metrics and requests ----------------------------------------------------------------------


def _series(points: Sequence[MetricsPoint], name: str) -> list[tuple[float, float]]:
    return [(p.t, p.values[name]) for p in points if name in p.values]


def activity(bundle: Bundle, trig: float) -> dict[str, Any]:
    """What the seat was doing in the minute before the trigger, from /metrics and the request shapes."""
    pts = sorted((p for p in bundle.metrics if p.t <= trig + 1e-9), key=lambda p: p.t)
    window = [p for p in pts if p.t >= trig - ACTIVITY_WINDOW_S]
    out: dict[str, Any] = {"window_s": ACTIVITY_WINDOW_S, "metrics_points": len(window)}

    def last(name: str) -> float | None:
        s = _series(window, name)
        return _r(s[-1][1]) if s else None

    def peak(name: str) -> float | None:
        s = _series(window, name)
        return _r(max(v for _, v in s)) if s else None

    w = words_of(bundle)
    out["running_reqs_last"] = last(w.running)
    out["running_reqs_max"] = peak(w.running)
    out["queue_reqs_last"] = last(w.queued)
    out["token_usage_last"] = last(w.kv_usage)
    # SGLang exports the gauge at 0.0 when no draft runs (an accepted length is >= 1 whenever one does): no figure.
    acc = [(t, v) for t, v in _series(window, w.accept_length) if v > 0]
    out["spec_accept_length_mean"] = _r(sum(v for _, v in acc) / len(acc)) if acc else None
    out["spec_accept_length_last"] = _r(acc[-1][1]) if acc else None
    gen = _series(pts, w.generated)
    rates = throughput_series(pts, w)
    win_rates = [r for t, r in rates if t >= trig - ACTIVITY_WINDOW_S]
    out["throughput_tok_s_mean"] = (_r(sum(win_rates) / len(win_rates), 1) if win_rates
                                    else last(w.gen_throughput))
    out["throughput_tok_s_last"] = _r(win_rates[-1], 1) if win_rates else None
    last_progress = None
    for (_t0, v0), (t1, v1) in itertools.pairwise(gen):
        if v1 > v0:
            last_progress = t1
    out["last_token_progress_s"] = None if last_progress is None else _r(last_progress - trig)
    out["requests"] = _requests_before(RequestTable.of(bundle.requests), trig)
    return out


def _requests_before(reqs: RequestTable, trig: float) -> dict[str, Any]:
    """The recorded requests that had arrived by the trigger, over the table's columns (~20,000 in an hour)."""
    before = reqs.t <= trig + 1e-9
    toks = np.sort(reqs.prompt_tokens[before]).tolist()
    return {
        "recorded": len(reqs),
        "before_trigger": int(np.count_nonzero(before)),
        "open_at_trigger": int(np.count_nonzero(before & ~(reqs.finished <= trig))),  # NaN (None): still open
        "prompt_tokens_p50": int(percentile(toks, 50)) if toks else None,
        "prompt_tokens_max": toks[-1] if toks else None,
        "prefix_groups": len(set(reqs.prefix_group[before].tolist())),
        "redacted": not bool(np.any(reqs.has_prompt[before])),
    }


def throughput_series(points: Sequence[MetricsPoint], words: EngineWords) -> list[tuple[float, float]]:
    """Generated tokens per second between successive scrapes (counter resets clamp to 0); else the engine's own
    throughput gauge, where it has one."""
    gen = _series(sorted(points, key=lambda p: p.t), words.generated)
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(gen):
        if t1 > t0:
            out.append((t1, max(0.0, (v1 - v0) / (t1 - t0))))
    if not out:
        out = _series(points, words.gen_throughput)
    return out


@dataclass(slots=True)
class Analysis:
    """Everything ``replay`` derives from a bundle (the report is its JSON)."""

    trigger_t: float
    divergence: dict[str, Any]
    stuck: list[dict[str, Any]]
    timeline: list[dict[str, Any]]
    rowfetch: dict[str, Any]
    activity: dict[str, Any]
    exited: list[dict[str, Any]]
    log_tail: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)


def analyse(bundle: Bundle) -> Analysis:
    """Run every analysis over a loaded bundle."""
    trig = bundle.manifest.trigger_t
    th = thresholds_of(bundle)  # the detectors' own (redetect): one source of every threshold in the report
    verdict = bundle.manifest.verdict  # replay re-derives it at its time (rerun_detectors): its ages are at that time
    funcs = _rowfetch_funcs(bundle)
    notes = []
    m = bundle.manifest.files
    for name, what in (("stacks.jsonl", "no stack history: timeline and stuck threads are empty"),
                       ("native_stacks.jsonl", "no capture-time native stacks: divergence uses the history"),
                       ("probe.jsonl", "no probe records: no row-fetch latency"),
                       ("metrics.jsonl", "no metrics history: no throughput before the trigger")):
        if name not in m:
            notes.append(f"{name} missing: {what}")
    exited = [{"rank": p.rank, "node": p.node, "pid": p.pid, "title": p.title, "exit_code": p.exit_code}
              for p in bundle.processes if not p.alive]
    exited.sort(key=lambda d: (d["node"], d["pid"]))
    tail: dict[str, list[str]] = {}
    by_node: dict[int, list[str]] = defaultdict(list)
    for ln in sorted(bundle.logs, key=lambda x: x.t):
        by_node[ln.node].append(ln.text)
    for node, text in bundle.log_text.items():
        if node not in by_node:
            by_node[node] = text.splitlines()
    for node in sorted(by_node):
        tail[str(node)] = [line[:500] for line in by_node[node][-20:]]
    return Analysis(
        trigger_t=trig,
        divergence=divergence(bundle, trig, funcs),
        stuck=stuck_threads(bundle, trig, funcs),
        timeline=timeline(bundle, trig, funcs),
        rowfetch=rowfetch_buckets(bundle, trig, stall_s=th.rowfetch_inflight_s,
                                  learned=learned_of(bundle) if th.learn_enabled else None,
                                  verdict_t=None if verdict is None else verdict.t),
        activity=activity(bundle, trig),
        exited=exited,
        log_tail=tail,
        notes=notes,
    )
