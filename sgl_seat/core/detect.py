"""Hang detectors: pure functions from recorded observations to one :class:`Verdict`.

The live sidecar (``sgl_seat.watchdog``) and offline ``replay`` (``sgl_seat.forensics``) call the same
:func:`detect` on the same record types, so a replayed bundle reproduces the live verdict. Nothing here
touches Ray, psutil, files or the clock: ``now`` is an argument, and every record later than ``now`` is
ignored (a fetch that ended after ``now`` counts as in flight at ``now``), so ``detect(obs, thresholds, now)``
is a function of its inputs. Every detector and the one ordering that picks among them.

Detectors, in priority order when several fire (the first is the verdict; the others are kept in
the evidence):

1. **process exited**: an engine process seen earlier is gone. Definitive, and it explains every
   other symptom (ranks waiting on a peer that died, no tokens). Which process caused the cascade is read
   from the engine's words and each node's own order of deaths, not from polls compared across nodes
   (:func:`_death_causes`).
2. **process stopped**: an engine process (scheduler, detokenizer or main) in ``/proc`` state ``T``
   (SIGSTOP) for ``stopped_s`` in every one of the sidecar's 20 Hz ``/proc`` reads (``EngineProcess.stopped_since``),
   or, in a bundle without them, in every sample, at least two (the sampler reads the state before each
   dump, and samples a stopped detokenizer or main process every round). Named from the process table, whether
   or not its stack could be read; its peers' probed calls and collectives wait for it, so it comes before them.
   For a detokenizer the evidence says whether the schedulers still progress.
3. **row-fetch stall**: a probed call in flight for longer than its threshold (learned from its shape's healthy
   calls, :mod:`sgl_seat.core.learned`; ``rowfetch_inflight_s`` for warm-up calls and unlearned shapes), on the host or
   on the GPU (its CUDA events say its work started on the stream and has not finished: a stalled kernel
   whose CPU thread ran on into the collective). It names the culprit rank directly, the moment the fetch
   is late, while its peers only look stuck, even when every rank's stack is the same device sync. With
   several late calls, the one whose rank is not waiting in a collective is named: a probed call may hold a
   collective itself (SGLang's ``VocabParallelEmbedding.forward`` all-reduces inside the call), so a stalled
   rank's peers have their probed calls in flight too, waiting in it (:func:`collective_wait`); only when
   every late call waits in a collective does the earliest start decide. A CUDA graph replay's record
   (``ProbeRecord.graph_key`` set: SGLang's decode and verify, where the host-table read is a kernel inside
   the graph) is read the same way: its CUDA events say it started (its start event, or the previous replay on
   its stream ended) and has not finished (its end event), and the verdict says "in flight on the GPU: graph
   replay, N tokens" with its shape key.
4. **stack unchanged**: a scheduler's main-thread stack identical for ``stack_unchanged_samples``
   samples while requests run and nothing progresses, and, where the rank is probed, none of its probed
   calls began or ended between those samples (:func:`went_round`). Ranks stuck in a collective are victims, so the
   rank that is *not* in a collective is named; the frame is where it sits. When every unchanged rank
   waits in a collective or device sync and the probe records carry GPU timing, the stacks are
   undecided (on a GPU the culprit's CPU thread waits there too): no verdict from stacks, the GPU record
   decides (detector 3) or the no-progress detector reports it later.
   Every rank sitting at the same frame of work, outside any collective, is one long forward (a 400k-token
   prefill), not a hang (:func:`one_forward`): this detector and no-progress hold off until it has lasted
   ``engine_timeout_s``, SGLang's own bound on a forward.
5. **engine watchdog**: SGLang's own ``Scheduler watchdog timeout`` log line (late, at
   ``--watchdog-timeout``, but definitive when nothing above fired).
6. **no progress**: no token progress on rank 0's ``/metrics`` for ``no_progress_s`` while requests
   run, and no probed row fetch finished in that time either (:func:`last_fetch_end`). The weakest signal
   (it says *that*, not *where*), so it comes last; its rank is attributed
   from stacks and probe records when they allow.

A probed call is matched to a frame by its qualified name (:func:`~sgl_seat.core.frames.frame_is_target`): a
real engine's targets are methods, and every layer has a ``forward``.

"Requests run" comes from ``sglang:num_running_reqs``; where no metrics were recorded, the stack
detector accepts probe activity just before the window instead (the engine was busy when it froze). An idle
engine fires nothing: SGLang's idle spin in ``Scheduler._poll_timeout_aborts``, the TP>1 idle broadcast of
the request receiver, and ``--sleep-on-idle``'s zmq poll all run no requests (``tests/unit/test_core_detect_real.py``).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.frames import collective_frame, stuck_frame, target_frame, target_qualname
from sgl_seat.core.learned import RowThresholds, row_thresholds, shape_key
from sgl_seat.core.observation import (
    Observation,
    in_flight,
    latest_by_pid,
    node_of,
    probe_targets,
    python_samples,
)
from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    LogLine,
    MetricsPoint,
    StackSample,
    ThreadStack,
    Verdict,
    VerdictKind,
)
from sgl_seat.core.stats import percentile
from sgl_seat.spec import WatchdogSpec

RUNNING = "sglang:num_running_reqs"
#: Counters (and slowly moving gauges) whose change means the engine made progress. SGLang bumps
#: ``generation_tokens_total`` when a request finishes, so with few long requests it can stay flat
#: while decode runs; ``num_used_tokens`` (KV in use) moves every decode step the scheduler reports.
PROGRESS_METRICS: tuple[str, ...] = (
    "sglang:generation_tokens_total",
    "sglang:num_used_tokens",
    "sglang:decode_sum_seq_lens",
    "sglang:forward_execution_seconds_total",
    "sglang:cuda_graph_passes_total",
)
WATCHDOG_LINE = "Scheduler watchdog timeout"
#: Completed fetches summarised in a stall's evidence: a fixed window, so the evidence does not depend on
#: how much history the caller passes (the live sidecar passes about a minute, a bundle two).
EVIDENCE_WINDOW_S = 60.0
_LOG_RANK = re.compile(r"\bTP(\d+)\b")
#: SGLang's SubprocessWatchdog line (contracts section 5), also what the sim logs.
_CRASHED = re.compile(r"Subprocess \S+ \(pid=(\d+)\) crashed with exit code (-?\d+|None)")
#: SGLang's log prefix names the rank: ``[2026-.. .. TP2 EP2] msg`` (contracts: utils/common.py prefix).
_LINE_TP = re.compile(r"^\[[^\]]*?\bTP(\d+)\b[^\]]*\]")
#: A scheduler's own error (it logs this and SIGQUITs its node).
_SCHED_EXC = re.compile(r"Scheduler hit an exception: (.*)")
#: Errors that say a *peer* died: the rank that logs one is a victim of the crash, not its cause (gloo's
#: "Connection closed by peer ... typically caused by a remote worker crashing", NCCL's remote errors).
_PEER_FAILURE = re.compile(r"Connection (?:closed|reset) by peer|remote worker crash|remote process exited"
                           r"|ncclRemoteError|communicator was aborted", re.IGNORECASE)
#: The dead peer's address in gloo's error ("Connection closed by peer [127.0.0.1]:5848", "Read error
#: [127.0.0.1]:2190: Connection reset by peer"): the local port of one
#: of the dead rank's sockets (EngineProcess.ports says whose).
_PEER_ADDR = re.compile(r"\[([^\]\s/]+)\]:(\d+)")  # the first [address]:port; never gloo's [source path:line]


def _fmt_s(x: float) -> str:
    return f"{x:.1f}s"


def _fmt_th(x: float) -> str:
    """A threshold: sub-second ones (learned, or stopped_s) with their second digit."""
    return _fmt_s(x) if x >= 1 else f"{x:.2g}s"


def waiting_ranks(obs: Observation, now: float, *, exclude: Iterable[int | None] = ()) -> tuple[int, ...]:
    """Scheduler ranks whose latest stack is in a collective or device sync (victims of a lagging peer)."""
    skip = set(exclude)
    targets = probe_targets(obs)
    out = set()
    for s in latest_by_pid(python_samples(obs, now)).values():
        if s.rank is None or s.rank in skip or not s.title.startswith("sglang::scheduler"):
            continue
        if collective_wait(s.main_thread(), targets) is not None:
            out.add(s.rank)
    return tuple(sorted(out))


def collective_wait(thread: ThreadStack | None, targets: Sequence[str]) -> Frame | None:
    """The collective (or device sync) ``thread`` waits in, unless it is doing a probed call's own work.

    A thread inside a probed call is the fetcher, not a waiter, when the call's work is what it sits in; but a
    probed call may itself hold a collective (SGLang's ``VocabParallelEmbedding.forward`` all-reduces its TP
    shards inside the call): a collective *inside* the probed frame is a wait for the peers like any other.
    """
    coll = collective_frame(thread)
    if coll is None or thread is None:
        return None
    probed = target_frame(thread, targets)
    if probed is None:
        return coll
    frames = thread.frames
    at = next(i for i, f in enumerate(frames) if f is coll)
    return coll if at < next(i for i, f in enumerate(frames) if f is probed) else None


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
        if s.t < since or s.rank is None or not s.title.startswith("sglang::scheduler") or s.error is not None \
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


# --------------------------------------------------------------------------------------------------
# Detectors: each returns a Verdict (without waiting_ranks; detect() fills them) or None.


def detect_process_exited(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    gone = [p for p in obs.processes if not p.alive and (p.gone_t is None or p.gone_t <= now)]
    if not gone:
        return None
    # Who died first: the engine's own "Subprocess ... (pid=P) crashed with exit code C" line if it names one
    # of them; else the earliest seen gone; ties (one sidecar tick) go to a scheduler, then the lowest rank.
    crashed: dict[int, int | None] = {}
    for ln in obs.logs:
        m = _CRASHED.search(ln.text)
        if m and ln.t <= now and int(m.group(1)) not in crashed:
            crashed[int(m.group(1))] = int(m.group(2)) if m.group(2) not in (None, "None") else None
    # Whose fault: a rank that logged an error of its own goes first, then ranks that died without a word, and
    # last the ranks whose error says a peer died (victims). Polling alone cannot order deaths within one tick.
    own, victims, victim_ports = _rank_errors(obs, now)
    order = list(crashed)
    # A rank that logged its own error SIGQUITs its node, whose cleanup may kill its neighbours before the
    # failing rank itself has finished exiting: it is the cause even if it is still seen alive.
    gone_keys = {(p.node, p.pid) for p in gone}
    gone += [p for p in obs.processes if (p.node, p.rank) in own and (p.node, p.pid) not in gone_keys]
    named = _named_by_victims(obs.processes, victim_ports)
    cause = _death_causes(gone, own, victims, named)
    gone.sort(key=lambda p: (cause[(p.node, p.pid)], -len(named.get((p.node, p.pid), ())),
                             own.get((p.node, p.rank), (math.inf, ""))[0],
                             order.index(p.pid) if p.pid in order else len(order),
                             p.gone_t if p.gone_t is not None else math.inf,
                             p.rank is None, p.rank if p.rank is not None else 0, p.node, p.pid))
    first = gone[0]
    if first.exit_code is None and first.pid in crashed:
        first = EngineProcess(node=first.node, pid=first.pid, title=first.title, rank=first.rank, alive=False,
                              exit_code=crashed[first.pid], gone_t=first.gone_t)
    last: StackSample | None = None
    for s in python_samples(obs, now):
        if s.pid == first.pid and s.error is None and s.threads:
            last = s
    frame = stuck_frame(last.main_thread(), probe_targets(obs)) if last else None
    ev = [f"engine process {first.pid} ({first.title}) on node {first.node} "
          + ("is gone" if not first.alive else "is exiting after its own error")
          + (f" (exit code {first.exit_code})" if first.exit_code is not None else "")]
    if (first.node, first.rank) in own:
        ev.append(f"rank {first.rank}'s own error: {own[(first.node, first.rank)][1][:300]}")
    elif cause[(first.node, first.pid)] == _NAMED_BY_PEERS:
        namers = named[(first.node, first.pid)]
        ev.append(f"named as the dead peer by the collective errors of {', '.join(f'rank {r}' for _, r, _ in namers)}"
                  f" ({', '.join(sorted({f'port {port}' for _, _, port in namers}))}: sockets of rank {first.rank})")
    elif first.rank is not None:
        silent = [p for p in gone[1:] if p.rank is not None and cause[(p.node, p.pid)] in (_SOLE_FIRST, _TIED_FIRST)]
        if silent:
            ev.append("also died first on its node without an error of its own: "
                      + ", ".join(f"rank {p.rank} (node {p.node})" for p in silent[:6])
                      + "; which went first across nodes is only the sidecars' polling order, not the engine's word")
        after = [p for p in gone if p.rank is not None and cause[(p.node, p.pid)] == _AFTER_ON_NODE]
        if after:
            ev.append("died after another engine process of their node (its cleanup): "
                      + ", ".join(f"rank {p.rank} (node {p.node})" for p in after[:6]))
    hit = sorted(r for (_, r) in victims if r is not None)
    if hit:
        ev.append(f"ranks {', '.join(map(str, hit))} failed their collective because a peer died (victims)")
    for p in gone[1:6]:
        ev.append(f"also gone: {p.pid} ({p.title}) on node {p.node}")
    if last is not None and frame is not None:
        ev.append(f"last sampled at {frame.label}")
    return Verdict(kind=VerdictKind.PROCESS_EXITED, rank=first.rank, node=first.node,
                   frame=frame.label if frame else None, t=now, evidence=tuple(ev))


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
                          f"{_fmt_s(ep.state_t - ep.stopped_since)} after", ep.node, ep.pid, ep.rank, ep.title))
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
    ev = [f"pid {pid} ({title}) on node {node} stopped (state T) for {_fmt_s(now - since)} "
          f"({how}; threshold {_fmt_th(th.stopped_s)})"
          + ("; its stack could not be read while stopped" if unread else "")]
    if rank is None:
        # A stopped detokenizer (or main process) holds no collective: say whether the schedulers still step.
        state = _window_state(_metrics_upto(obs, now), since, now)
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
        ev.append(f"also stopped: pid {f[3]} ({f[5]}) on node {f[2]} for {_fmt_s(now - f[0])}")
    return Verdict(kind=VerdictKind.PROCESS_STOPPED, rank=rank, node=node,
                   frame=frame.label if frame else None, t=now, evidence=tuple(ev))


#: Why a dead process may be the cause, best first (see _death_causes).
_OWN_ERROR, _NAMED_BY_PEERS, _SOLE_FIRST, _TIED_FIRST, _FIRST_HELPER, _AFTER_ON_NODE, _VICTIM = range(7)


def _named_by_victims(processes: Sequence[EngineProcess], victim_ports: Mapping[tuple[int, int | None], int],
                      ) -> dict[tuple[int, int], list[tuple[int, int | None, int]]]:
    """Per rank process (node, pid), the victims whose collective error names one of its sockets' ports as the
    peer that closed: [(victim node, victim rank, port)]. A port held by more than one rank process (two hosts
    may reuse a number) names nobody."""
    holders: dict[int, list[EngineProcess]] = {}
    for p in processes:
        if p.rank is not None:
            for port in p.ports:
                holders.setdefault(port, []).append(p)
    named: dict[tuple[int, int], list[tuple[int, int | None, int]]] = {}
    for (vnode, vrank), printed in sorted(victim_ports.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        # gloo prints the port as stored in the socket address, in network byte order (seen on x86: "[127.0.0.1]:7089"
        # for a socket on port 45339); either reading is taken, and one holder in all is required.
        hs = [(p, port) for port in {printed, ((printed & 0xFF) << 8) | (printed >> 8)} for p in holders.get(port, [])]
        if len(hs) == 1 and (hs[0][0].node, hs[0][0].rank) != (vnode, vrank):
            named.setdefault((hs[0][0].node, hs[0][0].pid), []).append((vnode, vrank, hs[0][1]))
    return named


def _death_causes(gone: Sequence[EngineProcess], own: Mapping[tuple[int, int | None], tuple[float, str]],
                  victims: set[tuple[int, int | None]],
                  named: Mapping[tuple[int, int], Sequence[object]]) -> dict[tuple[int, int], int]:
    """Per dead process (by node and pid), how likely it is the cause of the cascade: lower is likelier.

    Why: a crash takes its node and the seat down within tens of milliseconds (the peers' collectives fail,
    each failing rank SIGQUITs its node, whose cleanup kills the rest), and the sidecars see the deaths by
    polling, each node on its own clock and at its own lag: across nodes, the first seen gone is often not the
    first to die (the soak named a rank that the other node's cleanup killed, and a node's detokenizer, in 5 of
    20 crashes). What does hold is each node's own order, from one poller: a process seen gone after another of
    its node died in that node's cleanup, and a rank seen gone alone, before anything else of its node, died
    before any peer's error could reach it, while one seen in the same poll as a victim may be that victim's
    cleanup. So, best first: a rank with an error of its own; a rank that its peers' collective errors name as
    the peer that closed (gloo names it by address, :func:`_named_by_victims`: the engine's own words, which the
    soak's cross-node misorders lacked); a scheduler seen gone alone first on its node (no
    word of its own: the crash); one seen gone first but in one poll with others; a detokenizer or launcher
    among its node's first deaths (a scheduler that died first anywhere explains more); a process that died
    after another of its node; a rank whose error says a peer died (a victim).
    """
    first: dict[int, float] = {}
    for p in gone:
        if p.gone_t is not None and (p.node, p.rank) not in own:
            first[p.node] = min(first.get(p.node, math.inf), p.gone_t)
    in_first = {(p.node, p.pid) for p in gone if p.gone_t is not None and p.gone_t == first.get(p.node)}
    out: dict[tuple[int, int], int] = {}
    for p in gone:
        key = (p.node, p.rank)
        if key in own:
            c = _OWN_ERROR
        elif (p.node, p.pid) in named and key not in victims:
            c = _NAMED_BY_PEERS
        elif key in victims and p.rank is not None:
            c = _VICTIM
        elif p.gone_t is not None and p.gone_t > first.get(p.node, math.inf):
            c = _AFTER_ON_NODE
        elif p.rank is None:
            c = _FIRST_HELPER
        else:
            alone = p.gone_t is not None and not any(q[0] == p.node and q[1] != p.pid for q in in_first)
            c = _SOLE_FIRST if alone else _TIED_FIRST
        out[(p.node, p.pid)] = c
    return out


def _rank_errors(obs: Observation, now: float) -> tuple[dict[tuple[int, int | None], tuple[float, str]],
                                                          set[tuple[int, int | None]],
                                                          dict[tuple[int, int | None], int]]:
    """Scheduler errors by (node, rank) up to ``now``: (own errors with their first time and text, victims, the
    port each victim's error names as its dead peer's).

    Real SGLang logs ``Scheduler hit an exception: Traceback (most recent call last):`` and the traceback on the
    lines after it, unprefixed, its last line the error itself (gloo's "Connection reset by peer" among them);
    the sim logs the error on the one line. Both are read as the prefixed line plus its continuation lines.
    """
    own: dict[tuple[int, int | None], tuple[float, str]] = {}
    victims: set[tuple[int, int | None]] = set()
    ports: dict[tuple[int, int | None], int] = {}
    logs = [ln for ln in obs.logs if ln.t <= now]
    for i, ln in enumerate(logs):
        m = _SCHED_EXC.search(ln.text)
        tp = _LINE_TP.match(ln.text)
        if m is None or tp is None:
            continue
        key = (ln.node, int(tp.group(1)))
        text = _with_continuation(m.group(1), logs, i)
        if _PEER_FAILURE.search(text):
            victims.add(key)
            addr = _PEER_ADDR.search(text)
            if addr and key not in ports:
                ports[key] = int(addr.group(2))
        elif key not in own:
            own[key] = (ln.t, text)
    real = victims - set(own)
    return own, real, {k: v for k, v in ports.items() if k in real}


#: How many unprefixed lines after an exception line are its traceback (a long one is cut).
_TRACEBACK_LINES = 400
_PREFIXED = re.compile(r"^\[\d{4}-\d\d-\d\d ")


def _with_continuation(first: str, logs: Sequence[LogLine], i: int) -> str:
    """An error line's text and, when it opens a traceback, the error the traceback ends with (same node)."""
    if "Traceback" not in first:
        return first
    node = logs[i].node
    tail: list[str] = []
    for ln in logs[i + 1:]:
        if ln.node != node:
            continue
        if _PREFIXED.match(ln.text) or len(tail) >= _TRACEBACK_LINES:
            break
        tail.append(ln.text)
    last = next((t.strip() for t in reversed(tail) if t.strip() and not t.strip().startswith(("^", "~"))), "")
    return f"{last} ({first.strip()})" if last else first


def _call_stack(obs: Observation, pid: int, start: float, now: float) -> StackSample | None:
    """Process ``pid``'s latest readable stack taken in [start, now] (while a call that began at ``start`` ran)."""
    last = None
    for s in python_samples(obs, now):
        if s.pid == pid and s.t >= start and s.error is None and s.threads and (last is None or s.t >= last.t):
            last = s
    return last


def _native_wait(obs: Observation, st: StackSample, now: float) -> str | None:
    """The native frame a rank blocks in (``c10d::Work::wait``): its sample's innermost frame where that dump had
    native frames, else that of its latest native dump (a capture's) where one was taken."""
    th = st.main_thread()
    if th is not None and th.frames and th.frames[0].native:
        return th.frames[0].name
    nat = [x for x in obs.samples if x.native and x.pid == st.pid and x.node == st.node and x.t <= now and x.threads]
    if nat:
        nt = max(nat, key=lambda x: x.t).main_thread()
        if nt is not None and nt.frames and nt.frames[0].native:
            return nt.frames[0].name
    return None


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
        st = _call_stack(obs, int(pc.pid[i]), float(pc.start[i]), now)
        coll = collective_wait(st.main_thread(), targets) if st is not None else None
        if st is None or coll is None:
            tier.append(0)
        else:
            tier.append(2)
            r = int(pc.rank[i]) if int(pc.rank[i]) >= 0 else _rank_of_pid(obs, int(pc.pid[i]))
            waits[i] = (r if r is not None else -1, coll, st)
    order = sorted(range(len(late)), key=lambda k: (tier[k], k))  # stable: the earliest start within a tier
    pick = int(late[order[0]])
    since, worst = float(late_t[pick]), pc.record(pick)
    on_gpu = not in_flight(worst, now)
    rank = worst.rank if worst.rank >= 0 else _rank_of_pid(obs, worst.pid)
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
    ev = [f"{worst.target} {where} for {_fmt_s(now - since)} on rank {rank} (pid {worst.pid}, "
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
            nat = _native_wait(obs, st, now)
            ev.append(f"rank {r} waits in {coll.name.rsplit('.', 1)[-1]}" + (f" ({nat})" if nat else "")
                      + f" while rank {rank}'s {func} has been in flight for {_fmt_s(now - since)}")
        for w in waiting_ranks(obs, now, exclude=(rank, *(w[0] for w in waits.values()))):
            st = next((x for x in latest_by_pid(python_samples(obs, now)).values() if x.rank == w), None)
            coll = collective_wait(st.main_thread(), targets) if st is not None else None
            if coll is not None and st is not None:
                nat = _native_wait(obs, st, now)
                ev.append(f"rank {w} waits in {coll.name.rsplit('.', 1)[-1]}" + (f" ({nat})" if nat else "")
                          + f" while rank {rank}'s {func} has been in flight for {_fmt_s(now - since)}")
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
        ent = obs.learned.entries[shape_key(r.node, r.target, r.gather_size, r.graph_key)]
        return (f"{_fmt_th(float(rows.seconds[i]))} (learned from {ent.samples} healthy calls of its shape: "
                f"p{obs.learned.quantile:g} {ent.quantile_s * 1e3:.2f} ms x {obs.learned.k:g}, "
                f"floor {_fmt_th(obs.learned.floor_s)})")
    if rows.warmup[i]:
        return f"{_fmt_s(th.rowfetch_inflight_s)} (fixed: a warm-up call)"
    return _fmt_s(th.rowfetch_inflight_s)


def _rank_of_pid(obs: Observation, pid: int) -> int | None:
    for p in obs.processes:
        if p.pid == pid:
            return p.rank
    for s in obs.samples:
        if s.pid == pid:
            return s.rank
    return None


def went_round(pc: ProbeColumns, pid: int, t0: float, t1: float) -> bool:
    """Whether process ``pid`` started or finished a probed call in (t0, t1]: it went round its loop then.

    Why: a healthy sim rank spends most of each step in one line (its sleep to the step's modelled end), and a
    real scheduler in one kernel launch or sync, so 1 Hz samples can find it at the same line five times running
    while it steps. The stacks alone cannot tell that from a rank stuck in one call, and the metrics that
    should (tokens moving) can lag: the CI soak wrote a false stack-unchanged bundle for a healthy rank (5
    samples at ``Scheduler._step`` over 4 s) on a loaded box. A probed call that began or ended between the
    samples is the rank's own word that it was not stuck. A process without probe records gives no such word.
    """
    mine = pc.pid == pid
    if not bool(np.any(mine)):
        return False
    start, end = pc.start[mine], pc.end[mine]  # NaN end: in flight (compares false)
    return bool(np.any((t0 < start) & (start <= t1)) or np.any((t0 < end) & (end <= t1)))


def last_fetch_end(pc: ProbeColumns, now: float) -> float | None:
    """When the latest probed call that had finished by ``now`` finished (None: none had).

    A finished row fetch is progress as much as a token is (the sidecar's latch counts it so too): a stepping
    engine makes one each forward, while /metrics can lag seconds behind on a loaded host.
    """
    done = pc.end[pc.end <= now]
    return float(done.max()) if done.size else None


def _progress_sig(m: MetricsPoint) -> tuple[float, ...]:
    return tuple(m.values.get(k, math.nan) for k in PROGRESS_METRICS if k in m.values)


def _metrics_upto(obs: Observation, now: float) -> list[MetricsPoint]:
    pts = [m for m in obs.metrics if m.t <= now]
    pts.sort(key=lambda m: (m.t, m.node))
    return pts


def _window_state(pts: Sequence[MetricsPoint], t0: float, t1: float) -> tuple[bool, bool] | None:
    """(requests ran throughout, progress happened) over [t0, t1], from the points in it plus the one
    just before; None if no point covers the window."""
    before = [m for m in pts if m.t <= t0]
    inside = [m for m in pts if t0 < m.t <= t1]
    span = ([before[-1]] if before else []) + inside
    if len(span) < 2 or not any(RUNNING in m.values for m in span):
        return None
    ran = all(m.values.get(RUNNING, 0.0) > 0 for m in span)
    sigs = [_progress_sig(m) for m in span]
    progressed = any(a != b for a, b in itertools.pairwise(sigs))
    return ran, progressed


def detect_stack_unchanged(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    k = th.stack_unchanged_samples
    period = 1.0 / th.sample_hz
    pts = _metrics_upto(obs, now)
    targets = probe_targets(obs)
    by_pid: dict[int, list[StackSample]] = {}
    for s in python_samples(obs, now):
        if s.rank is not None and s.title.startswith("sglang::scheduler"):
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
        state = _window_state(pts, t0, t1)
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
    ev = [f"rank {rank} main-thread stack unchanged for {k} samples over {_fmt_s(sample.t - t0)}"
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


def detect_engine_watchdog(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    hits = [ln for ln in obs.logs if ln.t <= now and WATCHDOG_LINE in ln.text]
    if not hits:
        return None
    first = hits[0]
    m = _LOG_RANK.search(first.text)
    rank = int(m.group(1)) if m else None
    node = first.node if rank is None else node_of(obs, rank, first.node)
    frame = None
    if rank is not None:
        latest = [s for s in python_samples(obs, now) if s.rank == rank and s.error is None and s.threads]
        if latest:
            f = stuck_frame(latest[-1].main_thread(), probe_targets(obs))
            frame = f.label if f else None
    ev = [f"node {first.node} log: {first.text.strip()[:300]}"]
    return Verdict(kind=VerdictKind.ENGINE_WATCHDOG, rank=rank, node=node, frame=frame, t=now, evidence=tuple(ev))


def detect_no_progress(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    pts = _metrics_upto(obs, now)
    if len(pts) < 2:
        return None
    last = pts[-1]
    if now - last.t > max(th.no_progress_s, 3.0):
        return None  # metrics went stale: nothing to say from them
    sig = _progress_sig(last)
    if not sig:
        return None
    flat_since = last.t
    for m in reversed(pts[:-1]):
        if _progress_sig(m) != sig:
            break
        flat_since = m.t
    span = [m for m in pts if m.t >= flat_since]
    if last.t - flat_since < th.no_progress_s or not all(m.values.get(RUNNING, 0.0) > 0 for m in span):
        return None
    fetched = last_fetch_end(obs.probes, now)
    if fetched is not None and last.t - fetched < th.no_progress_s:
        return None  # row fetches still complete: the engine steps, its /metrics lag (see went_round)
    fwd = one_forward(obs, th, now)
    if fwd is not None and now - fwd.since < th.engine_timeout_s:
        return None  # every rank in one long forward (a long prefill), not a hang; bounded as above
    seen = forward_last_seen(obs, th, now, flat_since)
    if seen is not None and seen - flat_since < th.engine_timeout_s and last.t - seen < th.no_progress_s:
        return None  # flat only since a long forward ended (metrics lag it): count from its end
    rank, node, frame, why = _attribute(obs, now)
    ev = [f"no token progress for {_fmt_s(last.t - flat_since)} while {int(last.get(RUNNING))} requests run "
          f"(threshold {_fmt_s(th.no_progress_s)})"]
    if why:
        ev.append(why)
    return Verdict(kind=VerdictKind.NO_PROGRESS, rank=rank, node=node, frame=frame, t=now, evidence=tuple(ev))


def _attribute(obs: Observation, now: float) -> tuple[int | None, int | None, str | None, str | None]:
    """Who lags, for a verdict that does not say: the oldest in-flight probe, else the one scheduler
    whose latest stack is not in a collective while the others are."""
    pc = obs.probes
    host = pc.in_flight_at(now)
    rows = np.flatnonzero(host | pc.gpu_in_flight_at(now))
    targets = probe_targets(obs)
    if rows.size:
        # Since when: the call's start while it runs, else its GPU work's; oldest first, ties by rank, pid, then
        # the observation's order (lexsort is stable).
        gs = pc.gpu_start[rows]
        t = np.where(host[rows] | (gs == 0.0), pc.start[rows], gs)  # (the record form read `gpu_start or start`)
        k = int(np.lexsort((pc.pid[rows], pc.rank[rows], t))[0])
        since, p = float(t[k]), pc.record(int(rows[k]))
        rank = p.rank if p.rank >= 0 else _rank_of_pid(obs, p.pid)
        where = "in flight" if in_flight(p, now) else "in flight on the GPU"
        if p.graph_replay:
            where += f": graph replay, {p.gather_size} tokens, shape key {p.graph_key}"
        return (rank, node_of(obs, rank, p.node if p.node >= 0 else None),
                f"{p.target.rsplit(':', 1)[-1].rsplit('.', 1)[-1]} ({p.target})",
                f"rank {rank} has a row fetch {where} for {_fmt_s(now - since)}")
    latest = [s for s in latest_by_pid(python_samples(obs, now)).values()
              if s.rank is not None and s.title.startswith("sglang::scheduler")]
    free = [s for s in latest if collective_frame(s.main_thread()) is None]
    if latest and len(free) == 1 and len(latest) > 1:
        s = free[0]
        f = stuck_frame(s.main_thread(), targets)
        return (s.rank, s.node, f.label if f else None,
                f"rank {s.rank} is the only scheduler not waiting in a collective")
    return None, None, None, None


DETECTORS = (
    detect_process_exited,
    detect_process_stopped,
    detect_rowfetch_stall,
    detect_stack_unchanged,
    detect_engine_watchdog,
    detect_no_progress,
)


def detect_all(obs: Observation, thresholds: WatchdogSpec, now: float) -> list[Verdict]:
    """Every detector that fires, in priority order (without waiting ranks)."""
    out = []
    for det in DETECTORS:
        v = det(obs, thresholds, now)
        if v is not None:
            out.append(v)
    return out


def detect(obs: Observation, thresholds: WatchdogSpec, now: float) -> Verdict | None:
    """The highest-priority finding, with the ranks waiting in a collective; None when all is well.

    Replay: ``detect(Observation.of(samples=b.stacks, probes=b.probes, metrics=b.metrics, logs=b.logs,
    processes=b.processes, rank_nodes=m.rank_nodes), WatchdogSpec.model_validate(m.thresholds), m.verdict.t)``.
    """
    found = detect_all(obs, thresholds, now)
    if not found:
        return None
    top = found[0]
    ev = list(top.evidence)
    for v in found[1:]:
        ev.append(f"also: {v.kind.value}" + (f" (rank {v.rank})" if v.rank is not None else "")
                  + (f": {v.evidence[0]}" if v.evidence else ""))
    return Verdict(kind=top.kind, rank=top.rank, node=top.node, frame=top.frame, t=now, evidence=tuple(ev),
                   waiting_ranks=waiting_ranks(obs, now, exclude=(top.rank,)))


def thresholds_from(doc: Mapping[str, Any] | None) -> WatchdogSpec:
    """WatchdogSpec from a manifest's ``thresholds`` (unknown keys dropped; missing ones default)."""
    known = set(WatchdogSpec.model_fields)
    return WatchdogSpec.model_validate({k: v for k, v in (doc or {}).items() if k in known})
