"""Detector 3, **row-fetch stall**: a probed call in flight for longer than its threshold.

The threshold is learned from its shape's healthy calls (:mod:`sgl_seat.core.learned`; ``rowfetch_inflight_s`` for
warm-up calls and unlearned shapes). The call is late on the host or on the GPU (its CUDA events say its work started
on the stream and has not finished: a stalled kernel whose CPU thread ran on into the collective). It names the
culprit rank directly, the moment the fetch is late, while its peers only look stuck, even when every rank's stack is
the same device sync. With several late calls, the one whose rank is not waiting in a collective is named: a probed
call may hold a collective itself (SGLang's ``VocabParallelEmbedding.forward`` all-reduces inside the call), so a
stalled rank's peers have their probed calls in flight too, waiting in it
(:func:`~sgl_seat.core.detect.waits.collective_wait`); only when every late call waits in a collective does the
earliest start decide. A CUDA graph replay's record (``ProbeRecord.graph_key`` set: SGLang's decode and verify, where
the host-table read is a kernel inside the graph) is read the same way: its CUDA events say it started (its start
event, or the previous replay on its stream ended) and has not finished (its end event), and the verdict says "in
flight on the GPU: graph replay, N tokens" with its shape key.
"""

from __future__ import annotations

import numpy as np

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.detect.waits import call_stack, collective_wait, native_wait, rank_of_pid, waiting_ranks
from sgl_seat.core.detect.words import fmt_s, fmt_th
from sgl_seat.core.frames import target_frame, target_qualname
from sgl_seat.core.learned import RowThresholds, row_thresholds, shape_key
from sgl_seat.core.observation import Observation, in_flight, latest_by_pid, node_of, probe_targets, python_samples
from sgl_seat.core.records import Frame, StackSample, Verdict, VerdictKind
from sgl_seat.core.stats import percentile
from sgl_seat.spec import WatchdogSpec

#: Completed fetches summarised in a stall's evidence: a fixed window, so the evidence does not depend on
#: how much history the caller passes (the live sidecar passes about a minute, a bundle two).
EVIDENCE_WINDOW_S = 60.0


def detect_rowfetch_stall(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    """A probed call late; among several late ones, the one whose rank is not waiting in a collective.

    Why the stacks: a probed call may hold a collective (SGLang's ``VocabParallelEmbedding.forward`` all-reduces
    its TP shards inside the call), so when one rank stalls inside its probed call, its peers' probed calls are in
    flight too, waiting in the all-reduce; the earliest start then names whichever rank entered first, often a
    victim. A late call whose latest stack (taken while it ran) sits in a collective inside it is a victim; the
    culprit is a late call whose stack does not (or, on the GPU, whose stack says nothing). Only when every late
    call waits in a collective does the earliest start decide, as before.
    """
    # Over the probe columns (a bundle holds a million records): when each call began to be late, NaN if not.
    pc = obs.probes
    rows = row_thresholds(pc, obs.learned if th.learn_enabled else None, th.rowfetch_inflight_s, now)
    late_t = pc.late_since(now, rows.seconds)
    late = np.flatnonzero(~np.isnan(late_t))
    if not late.size:
        return None
    # Earliest first; ties by rank, pid, seq, then the observation's order (lexsort is stable).
    late = late[np.lexsort((pc.seq[late], pc.pid[late], pc.rank[late], late_t[late]))]
    targets = probe_targets(obs)
    host = pc.in_flight_at(now)
    # Per late row: 0 not known to wait (its stack, taken while the call ran, is outside any collective; or no
    # word: no stack, or the call returned and its GPU work is late), 2 it waits in a collective (a victim).
    tier: list[int] = []
    waits: dict[int, tuple[int, Frame, StackSample]] = {}  # row -> (rank, collective frame, its stack)
    for i in late.tolist():
        if not host[i]:
            tier.append(0)
            continue
        st = call_stack(obs, int(pc.pid[i]), float(pc.start[i]), now)
        coll = collective_wait(st.main_thread(), targets) if st is not None else None
        if st is None or coll is None:
            tier.append(0)
        else:
            tier.append(2)
            r = int(pc.rank[i]) if int(pc.rank[i]) >= 0 else rank_of_pid(obs, int(pc.pid[i]))
            waits[i] = (r if r is not None else -1, coll, st)
    order = sorted(range(len(late)), key=lambda k: (tier[k], k))  # stable: the earliest start within a tier
    pick = int(late[order[0]])
    since, worst = float(late_t[pick]), pc.record(pick)
    on_gpu = not in_flight(worst, now)
    rank = worst.rank if worst.rank >= 0 else rank_of_pid(obs, worst.pid)
    node = worst.node if worst.node >= 0 else node_of(obs, rank)
    func = target_qualname(worst.target)[1]
    frame_label = f"{func} ({worst.target})"
    last = latest_by_pid([s for s in python_samples(obs, now) if s.pid == worst.pid]).get(worst.pid)
    if last is not None:
        hit = target_frame(last.main_thread(), [worst.target]) or next(
            (f for t in last.threads if (f := target_frame(t, [worst.target])) is not None), None)
        if hit is not None:
            frame_label = hit.label
    done = pc.durations(now)[(pc.pid == worst.pid) & (now - EVIDENCE_WINDOW_S <= pc.end) & (pc.end <= now)
                             & pc.target_is(worst.target)].tolist()
    if worst.graph_replay:
        # A CUDA graph replay: the row fetch is a kernel inside the graph; the record is the replay's (its gather
        # size the replayed graph's token count, its key the captured shape), timed by its CUDA events (graph.py).
        what = f"graph replay, {worst.gather_size} tokens, shape key {worst.graph_key}"
        where = (f"in flight on the GPU: {what} (the replay's CUDA events: started on the stream, "
                 "not finished; the replay call itself returned)") if on_gpu else f"in flight ({what})"
        sized = f"graph replay of {worst.gather_size} tokens, shape key {worst.graph_key}"
    else:
        what = ""
        where = "on the GPU (CUDA events: started on the stream, not finished; the call itself returned)" \
            if on_gpu else "in flight"
        sized = f"gather size {worst.gather_size}"
    ev = [f"{worst.target} {where} for {fmt_s(now - since)} on rank {rank} (pid {worst.pid}, "
          f"thread {worst.thread}, {sized}); threshold {_threshold_words(obs, rows, pick, th)}"]
    if on_gpu:
        frame_label = f"{func} ({worst.target}) [GPU record{': ' + what if what else ''}]"
    if done:
        calls = "replays" if worst.graph_replay else "fetches"
        ev.append(f"its {calls} in the last {EVIDENCE_WINDOW_S:.0f}s: {len(done)}, "
                  f"p50 {percentile(done, 50) * 1e3:.2f} ms, p99 {percentile(done, 99) * 1e3:.2f} ms")
    if tier[order[0]] == 0:
        # Who waits for it: each victim's collective, inside its own probed call or not.
        for r, coll, st in sorted({w[0]: w for w in waits.values() if w[0] != rank}.values(), key=lambda w: w[0]):
            nat = native_wait(obs, st, now)
            ev.append(f"rank {r} waits in {coll.name.rsplit('.', 1)[-1]}" + (f" ({nat})" if nat else "")
                      + f" while rank {rank}'s {func} has been in flight for {fmt_s(now - since)}")
        for w in waiting_ranks(obs, now, exclude=(rank, *(w[0] for w in waits.values()))):
            st = next((x for x in latest_by_pid(python_samples(obs, now)).values() if x.rank == w), None)
            coll = collective_wait(st.main_thread(), targets) if st is not None else None
            if coll is not None and st is not None:
                nat = native_wait(obs, st, now)
                ev.append(f"rank {w} waits in {coll.name.rsplit('.', 1)[-1]}" + (f" ({nat})" if nat else "")
                          + f" while rank {rank}'s {func} has been in flight for {fmt_s(now - since)}")
    else:
        ev.append("every late call waits in a collective: the earliest to start is named")
    others = sorted({int(r) for r in pc.rank[late[late != pick]]} - {rank})
    if others:
        ev.append(f"also late: ranks {others}")
    return Verdict(kind=VerdictKind.ROWFETCH_STALL, rank=rank, node=node, frame=frame_label, t=now,
                   evidence=tuple(ev))


def _threshold_words(obs: Observation, rows: RowThresholds, i: int, th: WatchdogSpec) -> str:
    """The threshold row ``i`` was judged by, and where it came from (learned, or fixed and why)."""
    if rows.learned[i] and obs.learned is not None:
        r = obs.probes.record(i)
        key = rows.borrowed.get(i) or shape_key(r.node, r.target, r.gather_size, r.graph_key)
        ent = obs.learned.entries[key]
        whose = "its shape" if i not in rows.borrowed else \
            f"the nearest larger learned shape, {key.rsplit('|', 1)[-1]} (its own has too few)"
        return (f"{fmt_th(float(rows.seconds[i]))} (learned from {ent.samples} healthy calls of {whose}: "
                f"p{obs.learned.quantile:g} {ent.quantile_s * 1e3:.2f} ms x {obs.learned.k:g}, "
                f"floor {fmt_th(obs.learned.floor_s)})")
    if rows.warmup[i]:
        return f"{fmt_s(th.rowfetch_inflight_s)} (fixed: a warm-up call)"
    return fmt_s(th.rowfetch_inflight_s)


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.ROWFETCH_STALL,
    priority=3,
    thresholds=("learn_enabled", "rowfetch_inflight_s"),
    evidence=(r"\S+ (in flight|on the GPU).* for \d+\.\ds on rank (-?\d+|None) \(pid \d+, thread .*, "
              r"(gather size -?\d+|graph replay of \d+ tokens, shape key .*)\); threshold "),
    run=detect_rowfetch_stall,
)
