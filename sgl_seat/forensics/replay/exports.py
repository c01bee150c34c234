"""Exports for general-purpose viewers: speedscope (sampled profile per rank) and Chrome trace events.

speedscope (https://www.speedscope.app, file format ``https://www.speedscope.app/file-format-schema.json``)
shows where each rank's main thread spent the captured history as a flame graph; the Chrome trace
(``chrome://tracing`` or https://ui.perfetto.dev) lines the ranks up on one time axis with their state
segments, their row fetches (the stalled one still open at the trigger), throughput and the trigger.
Both are plain JSON built from the records; nothing is sampled anew.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from sgl_seat import __version__
from sgl_seat.core.records import Frame, StackSample
from sgl_seat.forensics.format.extras import words_of
from sgl_seat.forensics.replay.analysis import throughput_series
from sgl_seat.forensics.replay.replayer import ReplayResult

__all__ = ["chrome_trace", "speedscope"]

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
#: Row fetches exported to the trace: the most recent ones (plus every in-flight one), to keep files small.
MAX_TRACE_FETCHES = 20_000


def _proc_label(s: StackSample) -> str:
    who = f"rank {s.rank}" if s.rank is not None else s.title
    return f"{who} (node {s.node}, pid {s.pid}, {s.title})"


def speedscope(result: ReplayResult) -> dict[str, Any]:
    """One sampled profile per (process, thread) of the stack history; weights are seconds to the next sample."""
    frames: list[dict[str, Any]] = []
    index: dict[Frame, int] = {}

    def fid(f: Frame) -> int:
        i = index.get(f)
        if i is None:
            i = index[f] = len(frames)
            d: dict[str, Any] = {"name": f.name, "file": f.filename}
            if f.line:
                d["line"] = f.line
            frames.append(d)
        return i

    groups: dict[tuple[int, int, int], list[tuple[StackSample, int]]] = defaultdict(list)
    for s in result.bundle.stacks:
        for ti, th in enumerate(s.threads):
            groups[(s.node, s.pid, th.thread_id)].append((s, ti))
    trig = result.analysis.trigger_t

    def order(key: tuple[int, int, int]) -> tuple[int, int, int, int]:
        s = groups[key][0][0]
        return (0 if s.rank is not None else 1, s.rank if s.rank is not None else 0, key[1], key[2])

    profiles = []
    for key in sorted(groups, key=order):
        rows = sorted(groups[key], key=lambda r: r[0].t)
        samples: list[list[int]] = []
        weights: list[float] = []
        for i, (s, ti) in enumerate(rows):
            th = s.threads[ti]
            nxt = rows[i + 1][0].t if i + 1 < len(rows) else max(s.t, trig)
            w = max(nxt - s.t, 0.0) or 1e-3
            samples.append([fid(f) for f in reversed(th.frames)])  # speedscope wants the root first
            weights.append(round(w, 6))
        first = rows[0][0]
        th0 = first.threads[rows[0][1]]
        start = round(rows[0][0].t - trig, 6)
        profiles.append({
            "type": "sampled",
            "name": f"{_proc_label(first)} thread {th0.name or th0.thread_id}",
            "unit": "seconds",
            "startValue": start,
            "endValue": round(start + sum(weights), 6),
            "samples": samples,
            "weights": weights,
        })
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": f"sgl-seat bundle {result.bundle.manifest.bundle_id} ({result.bundle.manifest.seat})",
        "activeProfileIndex": 0,
        "exporter": f"sgl-seat {__version__}",
    }


def chrome_trace(result: ReplayResult) -> dict[str, Any]:
    """Chrome trace events: a process per rank with a "stack state" track and a "row fetch" track."""
    b = result.bundle
    a = result.analysis
    trig = a.trigger_t
    t0 = min([b.manifest.time_start, *(s.t for s in b.stacks[:1])])

    def us(t: float) -> int:
        return round((t - t0) * 1e6)

    ev: list[dict[str, Any]] = []
    pids: dict[int, int] = {}
    for r in a.timeline:
        pid = pids[r["rank"]] = r["rank"] + 1
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"rank {r['rank']} (node {r['node']}, pid {r['pid']})"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": r["rank"]}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "stack state"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 2, "args": {"name": "row fetch"}})
        for seg in r["segments"]:
            start = trig + seg["start_s"]
            ev.append({"ph": "X", "pid": pid, "tid": 1, "name": f"{seg['state']}: {seg['frame'] or '-'}",
                       "cat": seg["state"], "ts": us(start),
                       "dur": max(1, round((seg["end_s"] - seg["start_s"]) * 1e6)),
                       "args": {"samples": seg["samples"], "frame": seg["frame"]}})
    pt = b.probes.calls()  # heartbeats are not fetches
    n = len(pt)
    keep = set(range(max(0, n - MAX_TRACE_FETCHES), n)) | set(np.flatnonzero(np.isnan(pt.end)).tolist())
    for i in sorted(keep):
        rec = pt.record(i)
        pid = pids.get(rec.rank)
        if pid is None:
            pid = pids[rec.rank] = rec.rank + 1
            ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {rec.rank} (node {rec.node}, pid {rec.pid})"}})
        end = rec.end if rec.end is not None else trig
        ev.append({"ph": "X", "pid": pid, "tid": 2, "cat": "rowfetch",
                   "name": "fetch_rows IN FLIGHT" if rec.end is None else "fetch_rows", "ts": us(rec.start),
                   "dur": max(1, round((end - rec.start) * 1e6)),
                   "args": {"gather_size": rec.gather_size, "seq": rec.seq, "target": rec.target,
                            "in_flight": rec.end is None}})
    seat_pid = 1000
    ev.append({"ph": "M", "name": "process_name", "pid": seat_pid, "tid": 0,
               "args": {"name": "seat (rank 0 /metrics)"}})
    w = words_of(b)
    for t, rate in throughput_series(b.metrics, w):
        ev.append({"ph": "C", "pid": seat_pid, "tid": 0, "name": "throughput tok/s", "ts": us(t),
                   "args": {"tok/s": round(rate, 3)}})
    for p in sorted(b.metrics, key=lambda p: p.t):
        if w.running in p.values:
            ev.append({"ph": "C", "pid": seat_pid, "tid": 0, "name": "running requests", "ts": us(p.t),
                       "args": {"running": p.values[w.running]}})
    v = result.verdict
    ev.append({"ph": "i", "s": "g", "pid": seat_pid, "tid": 0, "ts": us(trig),
               "name": f"trigger: {v.kind.value} rank {v.rank}" if v else "trigger",
               "args": {"frame": v.frame if v else None}})
    ev.sort(key=lambda e: (e.get("ts", -1), e["pid"], e["tid"]))
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"bundle": b.manifest.bundle_id, "seat": b.manifest.seat, "t0_epoch_s": t0,
                          "exporter": f"sgl-seat {__version__}"}}
