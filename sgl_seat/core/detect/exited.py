"""Detector 1, **process exited**: an engine process seen earlier is gone.

Definitive, and it explains every other symptom (ranks waiting on a peer that died, no tokens), so it comes first.
Which process caused the cascade is read from the engine's words and each node's own order of deaths, not from polls
compared across nodes (:func:`_death_causes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from sgl_seat.core.detect.descriptor import Detector
from sgl_seat.core.frames import stuck_frame
from sgl_seat.core.observation import Observation, probe_targets, python_samples
from sgl_seat.core.records import EngineProcess, LogLine, StackSample, Verdict, VerdictKind
from sgl_seat.spec import WatchdogSpec

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


#: Registered in :data:`sgl_seat.core.detect.DETECTORS`.
DETECTOR = Detector(
    kind=VerdictKind.PROCESS_EXITED,
    priority=1,
    thresholds=(),
    evidence=r"engine process \d+ \(.*\) on node \d+ (is gone|is exiting after its own error)",
    run=detect_process_exited,
)
