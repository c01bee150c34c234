"""What the watchdog soak taught the detectors: one long forward on every rank is not a hang.

Why: a 400k-token prefill keeps every rank inside one forward for tens of seconds (stacks unchanged, tokens flat,
requests running). The soak (``bench/watchdog_soak.py``) saw a stack-unchanged bundle for each such prefill. These
tests pin the distinction the detectors now draw (every rank at the same frame of work vs one rank lagging while
its peers wait in a collective), and that faults during a long forward are still caught.
"""

from __future__ import annotations

from test_core_detect import ALL_REDUCE, FETCH, LOOP, MAIN, T0, TH, busy, fetch, healthy, metrics, obs, sample

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
