"""The draft policy ``off_above: N`` onto SGLang's adaptive tiers and back (sgl_seat.sizing.draft_tiers).

SGLang's own routing is held to :func:`route` in tests/contract/test_draft_tiers_sglang.py; here the mapping's
claims: without a CUDA-graph list N is exact; with one (SGLang pads the batch to it first) N rounds down to a
count whose padded size still routes below the zero tier, never up; reading a config back gives that count.
"""

from __future__ import annotations

import json

import pytest

from sgl_seat.sizing.draft_tiers import off_above_of, route, tiers_for

# SGLang's speculative capture list for --cuda-graph-max-bs-decode 64 (_generate_decode_cuda_graph_batch_sizes).
SPEC_GRAPHS_64 = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4)]


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 12, 31, 47, 63, 64, 100])
def test_without_padding_n_is_exact_both_ways(n: int) -> None:
    t = tiers_for(n, 3)
    assert t.off_key == n + 1 and t.speculates_up_to == n
    assert [t.steps_for(b) for b in (1, n, n + 1, n + 50)] == [3, 3, 0, 0]
    assert off_above_of(t.config()) == n
    assert json.loads(t.config_text()) == {"1": {"candidate_steps": [3]}, str(n + 1): {"candidate_steps": [0]}}


@pytest.mark.parametrize("n", [1, 5, 8, 9, 10, 11, 33, 41, 47, 63, 64, 65, 80])
def test_with_padding_n_rounds_down_and_reads_back(n: int) -> None:
    t = tiers_for(n, 3, SPEC_GRAPHS_64)
    upto = t.speculates_up_to
    assert 1 <= upto <= n
    # Every batch up to the count drafts, none above it (checked past the list's end, where SGLang stops padding).
    assert all(t.steps_for(b) == 3 for b in range(1, upto + 1))
    assert all(t.steps_for(b) == 0 for b in range(upto + 1, 200))
    assert off_above_of(t.config(), SPEC_GRAPHS_64) == upto
    # Idempotent: the count it gives maps onto the same tiers.
    assert tiers_for(upto, 3, SPEC_GRAPHS_64).off_key == t.off_key


def test_padding_cases_by_hand() -> None:
    # 9 + 1 = 10 is captured and 9 pads to 10 as well (the zero tier): 8 is the last that drafts.
    t = tiers_for(9, 3, SPEC_GRAPHS_64)
    assert (t.off_key, t.speculates_up_to) == (10, 8)
    # 12 + 1 pads to 14; 13 would pad to 14 too: so 12 is the last that drafts.
    t = tiers_for(12, 3, SPEC_GRAPHS_64)
    assert (t.off_key, t.speculates_up_to) == (14, 12)
    # Past the list (64) SGLang routes the batch itself: exact again.
    t = tiers_for(70, 3, SPEC_GRAPHS_64)
    assert (t.off_key, t.speculates_up_to) == (71, 70)


def test_route_is_largest_key_at_or_below_the_padded_batch() -> None:
    keys = (1, 8, 32, 64)  # SGLang's default tier keys
    assert [route(b, keys, None) for b in (1, 7, 8, 31, 32, 63, 64, 500)] == [1, 1, 8, 8, 32, 32, 64, 64]
    assert [route(b, keys, SPEC_GRAPHS_64) for b in (7, 9, 31, 33)] == [1, 8, 32, 32]


def test_a_config_that_drafts_in_its_largest_tier_never_turns_off() -> None:
    assert off_above_of({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}) is None
    assert off_above_of({"1": {"candidate_steps": [3]}, "8": {"candidate_steps": [0]}, "ema_alpha": 0.2}) == 7


@pytest.mark.parametrize("bad", [0, -1])
def test_refuses_a_policy_below_one_request(bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        tiers_for(bad, 3)
    with pytest.raises(ValueError, match="names no batch-size tier"):
        off_above_of({"ema_alpha": 0.2})
