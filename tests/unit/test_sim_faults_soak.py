"""The soak's sim additions: a rank slowed N times (alive), slow-then-stall, and the prefill cost knob.

Why: the watchdog soak (``bench/watchdog_soak.py``) must show that a slow but live rank and a long prefill
are not hangs, and that a stall preceded by slow row fetches is still caught; these pin what the sim does.
"""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.sim.args import ENV_PREFILL_MS, parse
from sgl_seat.sim.faults import SLOW, SLOW_STALL, Fault, FaultState, parse_fault
from sgl_seat.sim.step.costmodel import CostModel


def test_slow_factor_parses_and_round_trips() -> None:
    f = parse_fault("slow:rank=2,factor=5,for_s=30")
    assert f == Fault(SLOW, 2, factor=5.0, for_s=30.0)
    assert parse_fault(f.spec()) == f


@pytest.mark.parametrize(("text", "needle"), [
    ("slow:rank=1,factor=0.5", "factor must be at least 1"),
    ("slow-stall:rank=1,ms=100", "slow-stall needs ms"),
    ("slow-stall:rank=1,slow_s=3", "slow-stall needs ms"),
    ("slow-stall:rank=1,ms=0,slow_s=3", "ms must be above 0"),
    ("crash:rank=1,factor=2", "crash takes no key 'factor'"),
])
def test_new_keys_are_checked(text: str, needle: str) -> None:
    with pytest.raises(UsageError) as ei:
        parse_fault(text)
    assert needle in str(ei.value)


def test_slow_factor_stretches_steps_for_its_window_only() -> None:
    """GIVEN a rank slowed 5x for 10 s WHEN steps run THEN each is stretched 5x inside the window, 1x after."""
    st = FaultState(rank=1)
    st.arm(parse_fault("slow:rank=1,factor=5,for_s=10"), now=0.0)
    assert st.on_step(step=0, gather=4, now=0.0).slow_factor == 5.0
    assert st.on_step(step=1, gather=4, now=9.9).slow_factor == 5.0
    assert st.on_step(step=2, gather=4, now=10.1).slow_factor == 1.0


def test_slow_stall_slows_fetches_then_stalls_once() -> None:
    """GIVEN slow-stall with 4 s of slow fetches WHEN steps run THEN fetches are delayed, then one stall, then
    nothing more (the stall is the fault's end; clearing it is the operator's recovery)."""
    f = parse_fault("slow-stall:rank=3,ms=150,slow_s=4,after_steps=2")
    assert f == Fault(SLOW_STALL, 3, ms=150.0, slow_s=4.0, after_steps=2) and parse_fault(f.spec()) == f
    st = FaultState(rank=3)
    st.arm(f, now=0.0)
    before = st.on_step(step=1, gather=8, now=1.0)
    assert before.fetch_delay_ms == 0.0 and before.stall is None
    first = st.on_step(step=2, gather=8, now=2.0)
    assert first.fetch_delay_ms == 150.0 and first.stall is None
    assert st.on_step(step=3, gather=8, now=5.9).fetch_delay_ms == 150.0
    hit = st.on_step(step=4, gather=8, now=6.1)
    assert hit.stall == f and hit.stall_s is None and hit.fetch_delay_ms == 0.0
    after = st.on_step(step=5, gather=8, now=7.0)
    assert after.stall is None and after.fetch_delay_ms == 0.0


def test_prefill_knob_reaches_the_cost_model() -> None:
    """GIVEN SGLSEAT_SIM_PREFILL_TOKEN_MS=0.08 WHEN a 400k-token prompt is priced THEN it takes >= 30 s."""
    argv = ["--model-path", "m", "--tp-size", "1"]
    default = parse(argv, env={})
    slow = parse(argv, env={ENV_PREFILL_MS: "0.08"})
    assert default.prefill_token_ms == CostModel().prefill_token_ms
    assert slow.prefill_token_ms == 0.08
    ms = CostModel(prefill_token_ms=slow.prefill_token_ms).extend_step_ms(400_000, 1, None)
    assert ms >= 30_000
    assert CostModel(prefill_token_ms=default.prefill_token_ms).extend_step_ms(400_000, 1, None) < 30_000
    with pytest.raises(UsageError):
        parse(argv, env={ENV_PREFILL_MS: "-1"})


def _first_token(prompt_h: int | None) -> list[int]:
    from sgl_seat.sim.step.batch import Batcher, Req

    b = Batcher(capacity=10_000, max_running=4, cost=CostModel())
    b.add(Req(rid="r1", input_ids=list(range(300, 340)), max_new_tokens=2, prompt_h=prompt_h))
    plan = b.plan()
    assert plan is not None
    return [int(i) for i in b.complete(plan)[0]["ids"]]


def test_a_prompt_hash_computed_ahead_gives_the_same_tokens() -> None:
    """GIVEN the scheduler hashed a long prompt beside the forward (Req.prompt_h) WHEN the prefill completes
    THEN the first token is the one the hash computed at completion gives; a different hash would change it."""
    from sgl_seat.sim.step import tokens

    ahead = tokens.context_hash(list(range(300, 340)))
    assert _first_token(ahead) == _first_token(None)
    assert _first_token(ahead ^ 0x5555) != _first_token(None)
