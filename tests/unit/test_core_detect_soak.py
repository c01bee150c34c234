"""What the watchdog soak taught the detectors: one long forward on every rank is not a hang.

Why: a 400k-token prefill keeps every rank inside one forward for tens of seconds (stacks unchanged, tokens flat,
requests running). The soak (``bench/watchdog_soak.py``) saw a stack-unchanged bundle for each such prefill. These
tests pin the distinction the detectors now draw (every rank at the same frame of work vs one rank lagging while
its peers wait in a collective), and that faults during a long forward are still caught.
"""

from __future__ import annotations

from test_core_detect import (
    ALL_REDUCE,
    FETCH,
    LOOP,
    MAIN,
    T0,
    TH,
    _exc_line,
    busy,
    fetch,
    healthy,
    metrics,
    obs,
    sample,
    title,
)

from sgl_seat.core import detect as d
from sgl_seat.core.records import EngineProcess, Frame, VerdictKind
from sgl_seat.spec import WatchdogSpec

#: Where a sim rank sits during a step's modelled compute (its sleep to the step's end), as py-spy shows it.
COMPUTE = [Frame("Scheduler._step", "/src/sgl_seat/sim/scheduler.py", 344), LOOP, MAIN]
OTHER = [Frame("Scheduler._pack", "/src/sgl_seat/sim/scheduler.py", 512), LOOP, MAIN]


def long_forward(start: float, now: float, *, ranks: tuple[int, ...] = (0, 1, 2, 3),
                 frames: dict[int, list[Frame]] | None = None) -> dict[str, list]:  # type: ignore[type-arg]
    """Healthy until ``start``; then every rank in ``ranks`` sits in one forward (``frames`` overrides a rank's
    stack), tokens flat and requests running, until ``now``."""
    rec = healthy(start - 0.5)
    last = rec["metrics"][-1].values
    t = start
    while t <= now:
        rec["samples"] += [sample(t, r, (frames or {}).get(r, COMPUTE)) for r in ranks]
        rec["metrics"].append(metrics(t, gen=last["sglang:generation_tokens_total"], running=8,
                                      used=last["sglang:num_used_tokens"]))
        t += 1.0
    if ranks != (0, 1, 2, 3):
        rec["samples"] = [s for s in rec["samples"] if s.rank in ranks]
        rec["processes"] = [p for p in rec["processes"] if p.rank in ranks]
    return rec


def test_one_long_forward_on_every_rank_is_not_a_hang() -> None:
    """GIVEN every rank in the same compute frame for 40 s, no tokens, requests running
    WHEN detect runs through it THEN no verdict (before the fix: stack unchanged, then no progress)."""
    start = T0 + 12
    for dt in (6.0, 12.0, 25.0, 40.0):
        rec = long_forward(start, start + dt)
        assert d.detect(obs(**rec), TH, start + dt + 0.5) is None, dt
    fwd = d.one_forward(obs(**long_forward(start, start + 10)), TH, start + 10.5)
    assert fwd is not None and fwd.since == start and "Scheduler._step" in fwd.frame


def test_one_node_view_of_a_long_forward_is_not_a_hang() -> None:
    """GIVEN a sidecar's view (its node's two ranks) of the same long forward THEN no verdict either."""
    start = T0 + 12
    rec = long_forward(start, start + 20, ranks=(2, 3))
    assert d.detect(obs(**rec), TH, start + 20.5) is None


def test_a_lagging_rank_outside_any_collective_still_fires() -> None:
    """GIVEN rank 1 stuck in non-probed code while ranks 0, 2, 3 wait in all_reduce (not in step)
    WHEN 8 s pass THEN stack unchanged names rank 1: the exemption covers ranks in step only."""
    start = T0 + 12
    rec = long_forward(start, start + 8, frames={0: ALL_REDUCE, 1: OTHER, 2: ALL_REDUCE, 3: ALL_REDUCE})
    v = d.detect(obs(**rec), TH, start + 8.5)
    assert v is not None and v.kind == VerdictKind.STACK_UNCHANGED and v.rank == 1


def test_ranks_at_different_frames_are_not_one_forward() -> None:
    start = T0 + 12
    rec = long_forward(start, start + 8, frames={1: OTHER})
    assert d.one_forward(obs(**rec), TH, start + 8.5) is None
    v = d.detect(obs(**rec), TH, start + 8.5)
    assert v is not None and v.kind == VerdictKind.STACK_UNCHANGED


def test_a_single_rank_gives_no_evidence_of_a_forward() -> None:
    """GIVEN a one-rank view unchanged in compute with tokens flat THEN it still fires (one rank is not 'in step')."""
    start = T0 + 12
    rec = long_forward(start, start + 8, ranks=(0,))
    assert d.one_forward(obs(**rec), TH, start + 8.5) is None
    assert d.detect(obs(**rec), TH, start + 8.5) is not None


def test_a_forward_longer_than_the_engine_timeout_is_a_hang() -> None:
    """GIVEN engine_timeout_s=20 (SGLang's own bound on one forward) WHEN every rank sits in one forward for 25 s
    THEN the detectors fire again: the exemption ends where the engine itself would call it a hang."""
    th = WatchdogSpec(engine_timeout_s=20)
    start = T0 + 12
    assert d.detect(obs(**long_forward(start, start + 15)), th, start + 15.5) is None
    v = d.detect(obs(**long_forward(start, start + 25)), th, start + 25.5)
    assert v is not None and v.kind in (VerdictKind.STACK_UNCHANGED, VerdictKind.NO_PROGRESS)


def test_stale_samples_are_not_a_forward() -> None:
    """GIVEN the last samples are 10 s old (the sampler stopped) THEN no claim of a forward in progress."""
    start = T0 + 12
    rec = long_forward(start, start + 10)
    assert d.one_forward(obs(**rec), TH, start + 20.5) is None


def test_a_stall_during_a_long_forward_is_still_caught() -> None:
    """GIVEN a long forward, then rank 3's row fetch in flight for 4 s while 0-2 keep their frame
    THEN a row-fetch stall naming rank 3 (the probe decides, not the stacks)."""
    start = T0 + 12
    rec = long_forward(start, start + 12, frames={3: FETCH})
    rec["probes"].append(fetch(3, 999_999, start + 8.0, None))
    v = d.detect(obs(**rec), TH, start + 12.5)
    assert v is not None and v.kind == VerdictKind.ROWFETCH_STALL and v.rank == 3


def test_a_crash_during_a_long_forward_is_still_caught() -> None:
    start = T0 + 12
    rec = long_forward(start, start + 12)
    rec["processes"] = [EngineProcess(node=p.node, pid=p.pid, title=p.title, rank=p.rank, alive=p.rank != 2,
                                      gone_t=start + 11 if p.rank == 2 else None) for p in rec["processes"]]
    v = d.detect(obs(**rec), TH, start + 12.5)
    assert v is not None and v.kind == VerdictKind.PROCESS_EXITED and v.rank == 2


def after_forward(start: float, end: float, now: float) -> dict[str, list]:  # type: ignore[type-arg]
    """A long forward from ``start`` to ``end``; then the ranks move on (new frames each sample) while /metrics,
    polled about once a second, still shows the flat figures until ``now``."""
    rec = long_forward(start, end)
    last = rec["metrics"][-1].values
    t, step = end + 1.0, 0
    while t <= now:
        rec["samples"] += [busy(t, r, step + r) for r in range(4)]
        rec["metrics"].append(metrics(t, gen=last["sglang:generation_tokens_total"], running=8,
                                      used=last["sglang:num_used_tokens"]))
        t += 1.0
        step += 1
    return rec


def test_metrics_lagging_a_long_forward_are_not_a_hang() -> None:
    """GIVEN a 30 s forward, then the ranks busy again while the metrics lag 2 s behind WHEN detect runs THEN no
    verdict: flatness counts from the forward's end (the soak saw a no-progress bundle right after a prefill)."""
    start = T0 + 12
    rec = after_forward(start, start + 30, start + 32)
    assert d.forward_last_seen(obs(**rec), TH, start + 32.5, start) == start + 30
    assert d.detect(obs(**rec), TH, start + 32.5) is None


def test_no_progress_long_after_a_forward_still_fires() -> None:
    """GIVEN the same forward, then 7 s with the ranks moving and still no token WHEN detect runs THEN no
    progress fires: the forward only excuses flatness up to its end."""
    start = T0 + 12
    rec = after_forward(start, start + 30, start + 37)
    v = d.detect(obs(**rec), TH, start + 37.5)
    assert v is not None and v.kind == VerdictKind.NO_PROGRESS


# --- What the CI soak taught (session 4): a healthy rank sampled at one line, and a crash cascade seen by two polls


def stale_metrics(rec: dict[str, list], since: float, until: float) -> None:  # type: ignore[type-arg]
    """/metrics frozen at its value just before ``since`` until ``until`` (a loaded frontend answering late)."""
    pts = rec["metrics"]
    frozen = [m for m in pts if m.t < since][-1].values
    rec["metrics"] = [m if not since <= m.t <= until else metrics(m.t, gen=frozen["sglang:generation_tokens_total"],
                                                                 running=8, used=frozen["sglang:num_used_tokens"])
                      for m in pts]


def test_a_healthy_rank_sampled_at_one_line_is_not_stuck() -> None:
    """GIVEN healthy traffic (every rank's row fetch completes every 30 ms) where rank 1 is sampled at its step's
    sleep five times running (a sim rank spends most of each step there) and /metrics stays flat for those 4 s
    WHEN detect runs THEN no verdict: the rank's own fetches say it went round its loop. Before the fix: stack
    unchanged on rank 1 at Scheduler._step, 5 samples over 4.0 s (the CI soak's false bundle)."""
    rec = healthy(T0 + 30)
    rec["samples"] = [s for s in rec["samples"] if not (s.rank == 1 and s.t >= T0 + 26)]
    rec["samples"] += [sample(T0 + 26 + i, 1, COMPUTE) for i in range(5)]
    stale_metrics(rec, T0 + 26, T0 + 30)
    assert d.detect_stack_unchanged(obs(**rec), TH, T0 + 30.5) is None
    assert d.detect(obs(**rec), TH, T0 + 30.5) is None
    assert d.went_round(obs(**rec).probes, 101, T0 + 26, T0 + 30)


def test_metrics_flat_while_fetches_complete_is_not_no_progress() -> None:
    """GIVEN the same healthy seat with /metrics flat for 8 s (past no_progress_s) while every rank's fetches
    complete THEN no verdict; once the fetches stop too, no progress fires again."""
    rec = healthy(T0 + 30)
    stale_metrics(rec, T0 + 22, T0 + 30)
    assert d.detect(obs(**rec), TH, T0 + 30.2) is None
    rec["probes"] = [p for p in rec["probes"] if p.end is not None and p.end <= T0 + 23]
    v = d.detect(obs(**rec), TH, T0 + 30.2)
    assert v is not None and v.kind is VerdictKind.NO_PROGRESS


def test_a_rank_stuck_at_the_same_line_still_fires() -> None:
    """GIVEN rank 1 stops in its step (its fetches stop) while ranks 0, 2, 3 wait for it in all_reduce and tokens
    stop THEN stack unchanged names rank 1: the fix asks for the rank's own activity, not the seat's."""
    rec = healthy(T0 + 24)
    rec["probes"] = [p for p in rec["probes"] if p.end is not None and p.end <= T0 + 24.5]
    t = T0 + 25.0
    while t <= T0 + 31:
        rec["samples"] += [sample(t, r, COMPUTE if r == 1 else ALL_REDUCE) for r in range(4)]
        t += 1.0
    stale_metrics(rec, T0 + 24.5, T0 + 32)
    rec["metrics"] += [metrics(T0 + 25 + i, gen=rec["metrics"][-1].values["sglang:generation_tokens_total"], running=8,
                               used=rec["metrics"][-1].values["sglang:num_used_tokens"]) for i in range(7)]
    v = d.detect(obs(**rec), TH, T0 + 29.5)
    assert v is not None and v.kind is VerdictKind.STACK_UNCHANGED and v.rank == 1, v


def _gone(node: int, pid: int, title: str, rank: int | None, t: float) -> EngineProcess:
    return EngineProcess(node=node, pid=pid, title=title, rank=rank, alive=False, gone_t=t)


_RESET = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:2190: "
          "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")


def test_a_crash_is_named_from_its_nodes_order_not_another_nodes_earlier_poll() -> None:
    """GIVEN the soak's wrong crash verdict, as its bundle recorded it: rank 1 (node 0) SIGKILLed; ranks 0 and 2
    fail their collective ("Connection reset by peer"); node 1's cleanup kills rank 3. Node 1's sidecar saw rank 2
    gone, then rank 3 28 ms later; node 0's sidecar, polling late, saw ranks 0 and 1 gone in one poll 63 ms after
    node 1 saw rank 2 WHEN detect runs over the merged records THEN rank 1 is named: rank 3 died after a process
    of its own node (that node's cleanup). Before the fix: rank 3 (seen gone earlier, by another node's clock)."""
    t = T0
    ps = [_gone(0, 133, title(0), 0, t + 0.0633), _gone(0, 134, title(1), 1, t + 0.0633),
          _gone(0, 135, "sglang::detokenizer", None, t + 0.120),
          _gone(1, 136, title(2), 2, t), _gone(1, 137, title(3), 3, t + 0.028),
          _gone(1, 96, "python -m sgl_seat.sim.launch_server", None, t + 0.27)]
    logs = [_exc_line(t + 0.068, 0, _RESET), _exc_line(t + 0.044, 2, _RESET)]
    v = d.detect(obs(processes=ps, logs=logs), TH, t + 1)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (1, 0), v
    assert any("rank 3 (node 1)" in e and "cleanup" in e for e in v.evidence), v.evidence


def test_a_crash_is_not_pinned_on_another_nodes_detokenizer() -> None:
    """GIVEN rank 2 (node 1) crashes; node 0's detokenizer is seen gone first (node 0's poller ran ahead of node
    1's), node 0's ranks fail their collective WHEN detect runs over both nodes THEN rank 2 is named, not the
    detokenizer (rank None): the TP4 rehearsal's bundle named node 0's detokenizer."""
    t = T0
    ps = [_gone(0, 140, "sglang::detokenizer", None, t), _gone(0, 100, title(0), 0, t + 0.05),
          _gone(0, 101, title(1), 1, t + 0.05), _gone(1, 102, title(2), 2, t + 0.08),
          _gone(1, 103, title(3), 3, t + 0.13)]
    logs = [_exc_line(t + 0.01, 0, _RESET), _exc_line(t + 0.01, 1, _RESET)]
    v = d.detect(obs(processes=ps, logs=logs), TH, t + 1)
    assert v is not None and (v.rank, v.node) == (2, 1), v
    # node 0's view alone (its sidecar's live verdict) has no scheduler of its own that died first: it names none
    # of its victims over its detokenizer, and the merged view above is what the bundle writes
    local = d.detect(obs(processes=[p for p in ps if p.node == 0], logs=logs), TH, t + 1)
    assert local is not None and local.rank is None


def test_a_rank_seen_gone_alone_outranks_one_seen_with_a_victim() -> None:
    """GIVEN the CI soak's crash of rank 0, as its bundle recorded it: node 1's sidecar saw ranks 2 and 3 gone in one
    poll (rank 3 a victim, "Connection closed by peer"; rank 2 killed by node 1's cleanup) 14 ms before node 0's saw
    rank 0 gone alone; node 0's victim (rank 1) and detokenizer 66 ms later WHEN detect runs THEN rank 0: gone
    alone, before anything of its node, it died before any peer's error could reach it. (Before: rank 2.)"""
    t = T0
    ps = [_gone(0, 3496, "python -m sgl_seat.sim.launch_server", None, t + 0.0797),
          _gone(0, 3498, title(0), 0, t + 0.0138),
          _gone(0, 3499, title(1), 1, t + 0.0797), _gone(0, 3500, "sglang::detokenizer", None, t + 0.0797),
          _gone(1, 3497, "python -m sgl_seat.sim.launch_server", None, t + 0.0664),
          _gone(1, 3501, title(2), 2, t), _gone(1, 3502, title(3), 3, t)]
    logs = [_exc_line(t + 0.0138, 1, _CLOSED), _exc_line(t, 3, _CLOSED)]
    v = d.detect(obs(processes=ps, logs=logs), TH, t + 1)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (0, 0), v


_CLOSED = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
           "[127.0.0.1]:9092. This is typically caused by a remote worker crashing.")


def test_a_rank_still_in_a_long_forward_as_its_peers_leave_it_is_not_a_hang() -> None:
    """GIVEN a 30 s forward on every rank (a 400k-token prefill, tokens flat), then ranks 0-2 in the next all_reduce
    while rank 3's latest sample still shows the forward's frame WHEN detect runs THEN no verdict: its five unchanged
    samples lie in the forward, so they count from its end (the 8-minute soak's draft-on false bundle: rank 3 at
    Scheduler._step, 5 samples over 4.0 s, right after a 40 s prefill). Before: stack unchanged on rank 3.
    Five samples past the forward with no fetch, still there while its peers wait: stack unchanged again."""
    start = T0 + 12
    rec = long_forward(start, start + 30)
    flat = rec["metrics"][-1].values
    t = start + 31
    while t <= start + 36:
        rec["samples"] += [sample(t, r, COMPUTE if r == 3 else ALL_REDUCE) for r in range(4)]
        rec["metrics"].append(metrics(t, gen=flat["sglang:generation_tokens_total"], running=8,
                                      used=flat["sglang:num_used_tokens"]))
        t += 1.0
    first = {k: [x for x in v if getattr(x, "t", 0.0) <= start + 31] for k, v in rec.items() if k != "processes"}
    assert d.detect(obs(**first, processes=rec["processes"]), TH, start + 31.5) is None
    v = d.detect(obs(**rec), TH, start + 36.5)
    assert v is not None and v.kind is VerdictKind.STACK_UNCHANGED and v.rank == 3, v


def test_a_crash_named_by_its_peers_collective_errors_outranks_polling_order() -> None:
    """GIVEN the 30-minute soak's wrong crash verdicts (5 of 20): rank 0 (node 0) SIGKILLed; rank 3 (node 1) fails
    its collective and node 1's cleanup kills rank 2, which node 1's sidecar sees gone alone and first; node 0's
    sidecar sees rank 0 in one poll with its victim rank 1. Both victims' errors name the dead peer by address
    ("Connection closed by peer [127.0.0.1]:9092"), and port 9092 was one of rank 0's sockets as its sidecar last
    saw it WHEN detect runs THEN rank 0, named by its peers. Without the ports (an older bundle): rank 2, gone alone
    first on its node, as before."""
    t = T0

    def procs(with_ports: bool) -> list[EngineProcess]:
        ports = {0: (9092, 41000), 1: (9093, 41002), 2: (9094, 41004), 3: (9095, 41006)} if with_ports else {}
        return [
            EngineProcess(node=0, pid=200, title=title(0), rank=0, alive=False, gone_t=t + 0.060,
                          ports=ports.get(0, ())),
            EngineProcess(node=0, pid=201, title=title(1), rank=1, alive=False, gone_t=t + 0.060,
                          ports=ports.get(1, ())),
            EngineProcess(node=1, pid=202, title=title(2), rank=2, alive=False, gone_t=t, ports=ports.get(2, ())),
            EngineProcess(node=1, pid=203, title=title(3), rank=3, alive=False, gone_t=t + 0.030,
                          ports=ports.get(3, ()))]

    logs = [_exc_line(t - 0.01, 3, _CLOSED), _exc_line(t + 0.05, 1, _CLOSED)]
    v = d.detect(obs(processes=procs(True), logs=logs), TH, t + 1)
    assert v is not None and v.kind is VerdictKind.PROCESS_EXITED and (v.rank, v.node) == (0, 0), v
    assert any("rank 1, rank 3" in e and "port 9092" in e for e in v.evidence), v.evidence
    old = d.detect(obs(processes=procs(False), logs=logs), TH, t + 1)
    assert old is not None and (old.rank, old.node) == (2, 1), old
    # gloo prints the port in network byte order ("[127.0.0.1]:7089" for a socket on 45339, seen on this x86 box)
    swapped = [p if p.rank != 0 else EngineProcess(node=0, pid=200, title=title(0), rank=0, alive=False,
                                                   gone_t=t + 0.060, ports=(31525, 45339)) for p in procs(True)]
    as_printed = _CLOSED.replace("9092", "7089")
    printed = [_exc_line(t - 0.01, 3, as_printed), _exc_line(t + 0.05, 1, as_printed)]
    sw = d.detect(obs(processes=swapped, logs=printed), TH, t + 1)
    assert sw is not None and (sw.rank, sw.node) == (0, 0) and any("port 45339" in e for e in sw.evidence), sw
    # a port that two rank processes hold (two hosts reusing a number) names nobody
    shared = [p if p.rank != 2 else EngineProcess(node=1, pid=202, title=title(2), rank=2, alive=False, gone_t=t,
                                                   ports=(9092,)) for p in procs(True)]
    amb = d.detect(obs(processes=shared, logs=logs), TH, t + 1)
    assert amb is not None and (amb.rank, amb.node) == (2, 1), amb


def test_processes_keep_their_ports_through_json() -> None:
    p = EngineProcess(node=1, pid=7, title=title(2), rank=2, alive=False, gone_t=T0, ports=(9092, 41000))
    assert EngineProcess.from_json(p.to_json()) == p
    assert "ports" not in EngineProcess(node=1, pid=7, title="x", rank=None, alive=True).to_json()
