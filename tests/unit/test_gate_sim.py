"""What the gate's battery needs from the sim: ``--speculative-adaptive`` step tiers with KV for the largest tier,
and the sim-only free draft (``SGLSEAT_SIM_DRAFT_COST=0``). Figures here are the sim's (synthetic)."""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.sim.args import ENV_DRAFT_COST, parse
from sgl_seat.sim.step.adaptive import AdaptivePolicy
from sgl_seat.sim.step.batch import DECODE, Batcher, Req
from sgl_seat.sim.step.costmodel import CostModel, SpecShape

SPEC = SpecShape("EAGLE", 3, 1, 4, 0.81)
BASE = ["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_default_tiers_route_by_batch_size_and_drop_to_zero_at_64() -> None:
    """GIVEN SGLang's default tiers WHEN batches of 1, 8, 40 and 64 are routed THEN each gets its tier's starting step
    (3 where the tier has it, else the tier's middle) and a batch of 64 gets 0 steps."""
    p = AdaptivePolicy.load(None, initial_steps=3)
    assert [p.steps_for(b) for b in (1, 7, 8, 31, 40, 64, 200)] == [3, 3, 3, 3, 1, 0, 0]
    assert p.max_draft_tokens == 8


def test_the_ema_climbs_with_high_acceptance_and_falls_with_none() -> None:
    """GIVEN the batch-1 tier at 3 steps WHEN every draft is accepted for 40 verifies THEN it climbs to 7; WHEN none
    is accepted afterwards THEN it falls back to 1 (the tier's floor), as SGLang's EMA policy does."""
    p = AdaptivePolicy.load(None, initial_steps=3)
    for _ in range(40):
        p.on_verify(1, [p.steps_for(1)])
    assert p.steps_for(1) == 7
    for _ in range(200):
        p.on_verify(1, [0])
    assert p.steps_for(1) == 1
    assert p.steps_for(8) == 3  # another tier's state is its own


def test_zero_steps_still_costs_a_draft_forward_and_a_free_draft_costs_nothing() -> None:
    """GIVEN the cost model WHEN an adaptive step runs 0 draft steps THEN it costs one draft-extend forward above a
    plain decode; WHEN draft_cost is 0 THEN a draft step costs only the target's verify positions."""
    cost = CostModel()
    plain = cost.decode_step_ms(64, None)
    zero = cost.decode_step_ms(64, SPEC, steps=0)
    assert zero == pytest.approx(plain + cost.draft_step_frac * cost.floor_ms + cost.draft_token_ms * 64)
    free = CostModel(draft_cost=0.0)
    assert free.decode_step_ms(8, SPEC) == pytest.approx(free.floor_ms + free.token_ms * 8 * 4)
    assert free.extend_step_ms(1000, 1, SPEC) == pytest.approx(free.extend_step_ms(1000, 1, None))
    assert cost.tokens_per_step(SPEC, 0) == 1 and cost.tokens_per_step(SPEC, 7) == 8


def _run(b: Batcher, n: int, new: int = 16) -> list[int]:
    for i in range(n):
        b.add(Req(rid=f"r{i}", input_ids=list(range(i * 100, i * 100 + 50)), max_new_tokens=new))
    steps: list[int] = []
    while b.has_work():
        plan = b.plan()
        assert plan is not None
        if plan.kind == DECODE:
            steps.append(-1 if plan.spec_steps is None else plan.spec_steps)
        b.complete(plan)
    return steps


def test_batcher_reserves_the_largest_tier_and_frees_it() -> None:
    """GIVEN an adaptive batcher WHEN requests are admitted THEN each reserves the largest tier's 8 draft tokens on
    top of its output (static draft: 4; free draft: none), and the pool holds no reservation once all finish."""
    for adaptive, cost, want in ((AdaptivePolicy.load(None, 3), CostModel(), 8), (None, CostModel(), 4),
                                 (AdaptivePolicy.load(None, 3), CostModel(draft_cost=0.0), 0)):
        b = Batcher(capacity=100_000, max_running=64, cost=cost, spec=SPEC, adaptive=adaptive)
        assert b.lookahead == want
        b.add(Req(rid="x", input_ids=list(range(50)), max_new_tokens=16))
        plan = b.plan()
        assert plan is not None and b.pool.reserved == 16 + want
        b.complete(plan)
        while b.has_work():
            p = b.plan()
            assert p is not None
            b.complete(p)
        assert b.pool.reserved == 0


def test_batcher_runs_zero_steps_at_64_running() -> None:
    """GIVEN 64 requests on an adaptive batcher WHEN they decode together THEN every step runs 0 draft steps and emits
    one token per request (the tier of 64); 4 requests run 3 steps and emit more than one token per verify."""
    b = Batcher(capacity=1_000_000, max_running=64, cost=CostModel(), spec=SPEC, adaptive=AdaptivePolicy.load(None, 3))
    steps = _run(b, 64)
    assert steps and set(steps[:5]) == {0}
    assert b.spec_correct == 0 and b.spec_proposed == 0
    small = Batcher(capacity=1_000_000, max_running=64, cost=CostModel(), spec=SPEC,
                    adaptive=AdaptivePolicy.load(None, 3))
    _run(small, 4)
    assert small.spec_tokens / small.spec_forwards > 1.5


def test_flags_and_the_sim_only_knob() -> None:
    """GIVEN the sim's argv WHEN --speculative-adaptive is given THEN it is on (off with a reason for topk 2, as SGLang
    falls back); SGLSEAT_SIM_DRAFT_COST is read in [0, 1] and refused outside it."""
    cfg = parse([*BASE, "--speculative-adaptive"], env={ENV_DRAFT_COST: "0"})
    assert cfg.speculative_adaptive and cfg.draft_cost == 0.0
    assert cfg.server_args()["speculative_adaptive"] is True
    off = parse(["--model-path", "m", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                 "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6", "--speculative-adaptive"],
                env={})
    assert not off.speculative_adaptive and "topk" in off.extra["adaptive_disabled"]
    assert parse(BASE, env={}).draft_cost == 1.0
    with pytest.raises(UsageError, match=ENV_DRAFT_COST):
        parse(BASE, env={ENV_DRAFT_COST: "2"})
