"""The replay report made to agree with its verdict: what the headline says, every line says.

An operator at 3 a.m. follows the loudest line, so no line may point at another cause than the verdict's. Measured
on the README's real-engine demo (SIGSTOP of rank 1): the replay said "process stopped on rank 1" and then
"exploding bucket: gather 16-31 rows, max 31,710 ms" (a warm-up call long before the stop), and the HTML page said
"every rank waits in a collective: a mismatched or lost collective" under the stopped rank. The rules, applied
once to the analysis that the text, HTML and ``--json`` reports all render (``tests/unit/test_replay_agrees.py``
holds each on the committed real-engine bundles):

- **The cause bucket** (``rowfetch.cause_bucket``): only for a row-fetch stall, and then the gather-size bucket of
  the verdict rank's oldest stalled call in flight (a graph replay's token bucket where that call is a replay).
  Every other verdict names no bucket: the buckets stay as data, not as a cause.
- **Warm-up calls** (``rowfetch.warmup``): a process's first calls of each target (and each graph shape), seen
  when the bundle holds the process from its first call: its first prefill, its first decode, a shape's first
  replay. They are listed apart with their latency and are never the cause.
- **One threshold, one age** (:func:`threshold_words`, :func:`age_words`): a call in flight is shown with the
  threshold the detectors judged it by (learned or fixed, and which) and with its age at the trigger and at the
  verdict, each named: the verdict is evaluated after the trigger (at the capture), so its evidence's "in flight for"
  is the later of the two.
- **The collectives summary** (``divergence.summary``): a verdict that names a stopped or exited rank makes that
  rank the lagging one, whatever its last stack showed (a stopped process's stack is the one it froze in, often the
  collective itself), so the summary never says "a mismatched or lost collective" over a stopped rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sgl_seat.core.nodeloss import names
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.core.stats import gather_bucket, gather_bucket_label
from sgl_seat.forensics.format.bundle import Bundle
from sgl_seat.forensics.replay.analysis import WARMUP_CALLS, Analysis, lagging_where, warmup_rows

__all__ = ["WARMUP_CALLS", "age_words", "agree", "cause_lines", "progress_words", "seconds", "threshold_words"]

_WARMUP_LISTED = 20
#: What a rank that the verdict names is, for the collectives summary.
_NAMED_STATE = {VerdictKind.PROCESS_STOPPED: "stopped", VerdictKind.PROCESS_EXITED: "exited"}


def agree(analysis: Analysis, verdict: Verdict | None, bundle: Bundle) -> Analysis:
    """``analysis`` with its cause bucket, warm-up calls and collectives summary made to agree with ``verdict``."""
    rf = analysis.rowfetch
    rf["warmup"] = _warmup(bundle, analysis.trigger_t)
    cause = rf["cause_bucket"] = _cause_bucket(rf, verdict)
    for graph, table in ((False, rf.get("buckets", [])), (True, rf.get("graph_buckets", []))):
        for b in table:  # the renderers mark only the cause as STALLED; other calls past the threshold are data
            b["cause"] = cause is not None and cause["graph"] is graph and b["gather_size_min"] == cause[
                "gather_size_min"]
    for f in rf.get("in_flight_fetches", []):
        f["cause"] = bool(f.get("stalled")) and cause is not None and f.get("rank") == cause["rank"]
    if verdict is not None and verdict.kind in _NAMED_STATE and verdict.rank is not None:
        _name_the_rank(analysis.divergence, verdict.rank, _NAMED_STATE[verdict.kind], verdict.kind.value)
    return analysis


def _warmup(bundle: Bundle, now: float) -> dict[str, Any]:
    """The first :data:`WARMUP_CALLS` calls of each (process, target, graph shape), where the bundle holds the
    process's first call (call numbers count from 1 per process; :func:`~.analysis.warmup_rows`): their count, the
    slowest, and the first few. The completed ones are left out of the bucket statistics."""
    pt = bundle.probes.calls()  # heartbeats are not calls
    listed: list[dict[str, Any]] = []
    for i in np.flatnonzero(warmup_rows(pt)).tolist():
        r = pt.record(i)
        end = now if r.end is None else r.end
        listed.append({"rank": r.rank, "pid": r.pid, "seq": r.seq, "target": r.target, "gather_size": r.gather_size,
                       "graph_key": r.graph_key, "start_s": round(r.start - now, 3),
                       "ms": round(max(0.0, end - r.start) * 1000.0, 3), "in_flight": r.end is None})
    slowest = max((d["ms"] for d in listed), default=None)
    listed.sort(key=lambda d: -d["ms"])
    return {"calls": len(listed), "max_ms": slowest, "per_target": WARMUP_CALLS, "listed": listed[:_WARMUP_LISTED]}


def _cause_bucket(rf: dict[str, Any], verdict: Verdict | None) -> dict[str, Any] | None:
    if verdict is None or verdict.kind is not VerdictKind.ROWFETCH_STALL:
        return None
    calls = [c for c in rf.get("in_flight_fetches", []) if c.get("stalled") and c.get("rank") == verdict.rank]
    if not calls:
        return None
    call = max(calls, key=lambda c: c["age_ms"])
    graph = call.get("graph_key") is not None
    lo, hi = gather_bucket(int(call["gather_size"]))
    table = rf.get("graph_buckets", []) if graph else rf.get("buckets", [])
    row = next((b for b in table if b["gather_size_min"] == lo), None)
    return {"gather_size_min": lo, "gather_size_max": hi, "rank": verdict.rank, "target": call["target"],
            "gather_size": call["gather_size"], "age_ms": call["age_ms"], "graph": graph,
            **{k: call[k] for k in ("age_at_verdict_ms", "verdict_after_s", "threshold_s", "threshold_from")
               if k in call},
            **({"graph_key": call["graph_key"]} if graph else {}),
            "max_ms": row["max_ms"] if row else call["age_ms"], "p99_ms": row["p99_ms"] if row else None,
            "count": row["count"] if row else None}


def _name_the_rank(div: dict[str, Any], rank: int, state: str, kind: str) -> None:
    """Make ``rank`` the lagging rank of the collectives summary (``state``: stopped or exited)."""
    ranks = div.get("ranks", [])
    row = next((r for r in ranks if r["rank"] == rank), None)
    if row is None or (row["state"] == state and rank in div.get("lagging", [])):
        return  # already the lagging rank, in its state: the summary says so
    if row["state"] != state:
        row["state_seen"] = row["state"]
        row["state"] = state
    waiting = [r["rank"] for r in ranks if r["state"] == "collective"]
    elsewhere = [r["rank"] for r in ranks if r["state"] != "collective"]
    div.update(waiting=waiting, elsewhere=elsewhere, lagging=elsewhere if waiting else [rank])
    div["summary"] = (f"{names(waiting)} wait in a collective; lagging: {lagging_where(ranks, div['lagging'])} "
                      f"(the verdict, {kind}: the others wait for it)"
                      if waiting else f"rank {rank} {state} ({kind}); no rank waits in a collective")


def seconds(x: float) -> str:
    """A duration as the verdict's evidence writes it (``core.detect``): one decimal, two figures under a second."""
    return f"{x:.1f} s" if abs(x) >= 1 else f"{x:.2g} s"


def threshold_words(f: dict[str, Any]) -> str:
    """"threshold 0.3 s (learned)": the threshold an in-flight call was judged by, and where it came from."""
    return f"threshold {seconds(f['threshold_s'])} ({f['threshold_from']})"


def age_words(f: dict[str, Any]) -> str:
    """An in-flight call's age at the trigger and, where the verdict was judged later, at the verdict (its
    evidence's figure: one decimal, as ``core.detect`` writes it)."""
    out = f"{seconds(f['age_ms'] / 1000.0)} at the trigger"
    after = f.get("verdict_after_s")
    if after is not None and "age_at_verdict_ms" in f and after > 0:
        out += (f", {f['age_at_verdict_ms'] / 1000.0:.1f} s at the verdict (judged {seconds(after)} after the "
                "trigger, at the capture)")
    return out


def progress_words(last_s: float | None) -> str:
    """The last time the generated-token counter grew, relative to the trigger, in words."""
    if last_s is None:
        return "no growth of the generated-token counter in the metrics"
    return f"tokens last grew {abs(last_s):g} s {'before' if last_s <= 0 else 'after'} the trigger (metrics scrapes)"


def cause_lines(doc: dict[str, Any]) -> list[str]:
    """What the row fetches say about the verdict, in words the HTML report uses too (forensics.replay.agree)."""
    rf, v = doc["rowfetch"], doc.get("verdict")
    out = []
    c = rf.get("cause_bucket")
    if c is not None:
        what = "graph replays of" if c["graph"] else "gather"
        out.append(f"cause: {what} {gather_bucket_label(c['gather_size_min'])} {'tokens' if c['graph'] else 'rows'} "
                   f"on rank {c['rank']}, in flight {age_words(c)}, {threshold_words(c)} ({c['target']})")
    elif v is not None and v["kind"] != "row-fetch stall" and any(f.get("stalled") for f in rf["in_flight_fetches"]):
        out.append(f"row fetches in flight past the threshold are not the cause: the verdict is {v['kind']}"
                   + (f" on rank {v['rank']}" if v.get("rank") is not None else ""))
    w = rf.get("warmup") or {}
    if w.get("calls"):
        out.append(f"warm-up calls (each process's first {w['per_target']} per target after its start; never the "
                   f"cause, left out of the bucket statistics): {w['calls']}, the slowest {w['max_ms']:,.0f} ms")
    return out
