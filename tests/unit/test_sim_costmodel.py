"""The cost model has the paper's shape: the draft wins single-stream and loses at 64 concurrent."""

from __future__ import annotations

import pytest

from sgl_seat.sim.step.costmodel import DEFAULT_ACCEPT_RATE, CostModel, SpecShape, accepted_drafts

SPEC = SpecShape(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4, accept_rate=DEFAULT_ACCEPT_RATE)


def _throughput(cost: CostModel, concurrent: int, slots: int, spec: SpecShape | None) -> float:
    """Steady-state output tokens/s with ``concurrent`` clients and ``slots`` running at most."""
    n = min(concurrent, slots)
    per_req = 1.0 if spec is None else spec.expected_accept_length
    return n * per_req / (cost.decode_step_ms(n, spec) / 1000.0)


@pytest.mark.parametrize("floor_ms", [2.0, 3.0, 10.0, 30.0])
def test_paper_shape_at_any_floor(floor_ms: float) -> None:
    cost = CostModel(floor_ms=floor_ms)
    single = _throughput(cost, 1, 8, SPEC) / _throughput(cost, 1, 32, None)
    at64 = _throughput(cost, 64, 8, SPEC) / _throughput(cost, 64, 32, None)
    assert single > 1.5, single
    assert at64 < 0.95, at64


def test_large_seat_single_stream_near_the_paper() -> None:
    """Default floor: ~33 tok/s draft off and ~95 draft on (the paper: 27-28 and 95)."""
    cost = CostModel()
    assert 25 < _throughput(cost, 1, 32, None) < 40
    assert 80 < _throughput(cost, 1, 8, SPEC) < 110


def test_tokens_per_step_is_the_verify_width() -> None:
    cost = CostModel()
    assert cost.tokens_per_step(None) == 1
    assert cost.tokens_per_step(SPEC) == 4
    assert cost.decode_step_ms(0, None) == 0.0
    assert cost.decode_step_ms(4, SPEC) > cost.decode_step_ms(4, None)
    assert cost.extend_step_ms(1000, 1, SPEC) > cost.extend_step_ms(1000, 1, None) > cost.extend_step_ms(10, 1, None)


def test_accepted_drafts_is_deterministic_with_the_configured_mean() -> None:
    draws = [accepted_drafts(f"r{i}", s, SPEC) for i in range(200) for s in range(10)]
    assert draws == [accepted_drafts(f"r{i}", s, SPEC) for i in range(200) for s in range(10)]
    assert all(0 <= d <= 3 for d in draws)
    mean_rate = sum(draws) / (len(draws) * SPEC.proposed_per_step)
    assert abs(mean_rate - DEFAULT_ACCEPT_RATE) < 0.03
    assert SPEC.expected_accept_length == pytest.approx(1 + 0.81 * 3)


def test_accept_rate_extremes() -> None:
    never = SpecShape("EAGLE", 3, 1, 4, 0.0)
    always = SpecShape("EAGLE", 3, 1, 4, 1.0)
    assert {accepted_drafts("x", s, never) for s in range(50)} == {0}
    assert {accepted_drafts("x", s, always) for s in range(50)} == {3}
