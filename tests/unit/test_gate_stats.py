"""The battery's statistics on seeded synthetic samples whose true answer is known: the t quantile against its
table, interval coverage, the three-way gate, A/A never failing, and the crossover bracketing the true one."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from sgl_seat.gate.intervals import (
    Interval,
    Outcome,
    band_of,
    crossover,
    judge,
    judge_rate,
    paired_log_ratio,
    rate_ratio,
    t_quantile,
)


@pytest.mark.parametrize(("p", "df", "want"), [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.95, 2, 2.9200), (0.95, 4, 2.1318),
    (0.95, 8, 1.8595), (0.975, 30, 2.0423), (0.5, 3, 0.0), (0.025, 2, -4.3027),
])
def test_t_quantile_matches_the_table(p: float, df: int, want: float) -> None:
    """GIVEN Student's t tables (bench-anchors: one-sided 95 % df 2 -> 2.92, df 4 -> 2.13, df 8 -> 1.86) WHEN the
    quantile is computed THEN it matches to 4 decimals."""
    assert t_quantile(p, df) == pytest.approx(want, abs=2e-4)


def _sample(rng: random.Random, n: int, true_ratio: float, cv: float) -> tuple[list[float], list[float]]:
    """n paired runs: a shared drift per run (cancels in the pair), independent noise of ``cv`` on each arm."""
    base, cand = [], []
    for _ in range(n):
        drift = math.exp(rng.gauss(0, 0.05))
        base.append(1000 * drift * math.exp(rng.gauss(0, cv)))
        cand.append(1000 * true_ratio * drift * math.exp(rng.gauss(0, cv)))
    return base, cand


@pytest.mark.parametrize("n", [3, 5])
def test_interval_covers_the_true_ratio_about_95_percent(n: int) -> None:
    """GIVEN 2000 seeded batteries with a known ratio of 0.86 and 3 % run noise WHEN each gets its paired interval
    THEN about 95 % of the intervals contain 0.86 (93-97 %), so the interval is neither too narrow nor too wide."""
    rng = random.Random(7 + n)
    hits = 0
    for _ in range(2000):
        iv = paired_log_ratio(*_sample(rng, n, 0.86, 0.03))
        hits += iv.low <= 0.86 <= iv.high
    assert 0.93 <= hits / 2000 <= 0.97, hits / 2000


def test_pairing_cancels_shared_drift() -> None:
    """GIVEN runs whose shared drift (5 %) is larger than the noise (0.5 %) WHEN paired THEN the interval is much
    narrower than the drift: pairing removes what both arms of a repetition shared."""
    iv = paired_log_ratio(*_sample(random.Random(3), 5, 0.9, 0.005))
    assert iv.half_width < 0.02 and iv.low < 0.9 < iv.high


def test_gate_outcomes() -> None:
    """GIVEN intervals on each side of a 0.95 threshold WHEN judged THEN above -> PASS, below -> FAIL, straddling ->
    INCONCLUSIVE, and for a lower-is-better gate the same mirrored."""
    above, below, across = Interval(1.0, 0.96, 1.04, 3, 0.01), Interval(0.8, 0.7, 0.9, 3, 0.05), \
        Interval(0.95, 0.9, 1.0, 3, 0.02)
    assert [judge(x, 0.95, higher_is_better=True) for x in (above, below, across)] == \
        [Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE]
    assert judge(Interval(1.0, 0.98, 1.05, 3, 0.01), 1.10, higher_is_better=False) is Outcome.PASS
    assert judge(Interval(3.7, 3.5, 3.9, 3, 0.01), 1.10, higher_is_better=False) is Outcome.FAIL
    assert judge(Interval(1.1, 1.0, 1.2, 3, 0.01), 1.10, higher_is_better=False) is Outcome.INCONCLUSIVE
    one = paired_log_ratio([100.0], [80.0])
    assert one.n == 1 and one.low == 0.0 and math.isinf(one.high)
    assert judge(one, 0.95, higher_is_better=True) is Outcome.INCONCLUSIVE


def test_aa_almost_never_fails_and_a_real_loss_fails() -> None:
    """GIVEN 2000 seeded A/A batteries (true ratio 1, 3 % noise, n = 3) WHEN gated at >= 0.95 THEN FAIL is rare
    (at most 2.5 %, the interval's one tail beyond 1 -> 0.95 is further still); GIVEN a true 0.80 THEN FAIL mostly."""
    rng = random.Random(11)
    aa = [judge(paired_log_ratio(*_sample(rng, 3, 1.0, 0.03)), 0.95, higher_is_better=True) for _ in range(2000)]
    assert aa.count(Outcome.FAIL) / 2000 <= 0.025
    loss = [judge(paired_log_ratio(*_sample(rng, 3, 0.80, 0.03)), 0.95, higher_is_better=True) for _ in range(500)]
    assert loss.count(Outcome.FAIL) / 500 > 0.8


def test_paired_log_ratio_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="equal"):
        paired_log_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_log_ratio([1.0, 0.0], [1.0, 1.0])


def _curve(levels: list[int], cross: float, rng: random.Random, n: int = 5) -> list[Interval]:
    """Ratio falls linearly in log concurrency through 1 at ``cross``."""
    out = []
    for c in levels:
        true = math.exp(-0.25 * (math.log(c) - math.log(cross)))
        out.append(paired_log_ratio(*_sample(rng, n, true, 0.02)))
    return out


def test_crossover_brackets_the_true_crossover() -> None:
    """GIVEN a ratio curve crossing 1 at 20 concurrent (seeded noise) WHEN the crossover is computed THEN its
    estimate is near 20 and its interval contains 20; the bands say on at 1-8 and off at 64."""
    levels = [1, 8, 16, 32, 64]
    ivs = _curve(levels, 20.0, random.Random(5))
    cx = crossover(levels, ivs)
    assert cx.estimate is not None and 14 < cx.estimate < 28
    assert cx.low is not None and cx.high is not None and cx.low <= 20 <= cx.high
    assert band_of(ivs[0]) == "on" and band_of(ivs[-1]) == "off"


def test_a_noisy_first_level_does_not_hide_the_crossing_after_it() -> None:
    """GIVEN the sim battery's shape (measured in tests/integration/test_gate.py: c=1 [0.69, 8.6], c=8 [1.65, 1.72],
    c=64 [0.26, 1.03]) WHEN the crossover is computed THEN the lower edge, above 1 from c=8, falls through 1 between
    8 and 64 (the lower bound); the upper edge never does (None); an edge never above 1 gives None."""
    ivs = [Interval(2.43, 0.69, 8.59, 2, 0.14), Interval(1.68, 1.65, 1.72, 2, 0.002),
           Interval(0.51, 0.26, 1.03, 2, 0.08)]
    cx = crossover([1, 8, 64], ivs)
    assert cx.low is not None and cx.estimate is not None and cx.high is None
    assert 8 < cx.low < cx.estimate < 64
    flat = [Interval(1.1, 0.5, 1.9, 2, 0.3)] * 3
    assert crossover([1, 8, 64], flat).low is None


def test_crossover_outside_the_sweep() -> None:
    """GIVEN a draft that loses everywhere, or pays everywhere WHEN the crossover is computed THEN it says below the
    sweep, or beyond it, with no estimate."""
    levels = [1, 8, 64]
    lose = [Interval(0.8, 0.75, 0.85, 3, 0.01)] * 3
    win = [Interval(1.5, 1.4, 1.6, 3, 0.01)] * 3
    assert crossover(levels, lose).below_sweep and crossover(levels, lose).estimate is None
    assert crossover(levels, win).beyond_sweep and crossover(levels, win).estimate is None
    with pytest.raises(ValueError, match="ascending"):
        crossover([8, 1, 64], lose)


# -- the hangs gate's rate ratio ----------------------------------------------------------------------------------


def _binom_tail_ge(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _solve(f: Callable[[float], float], target: float, increasing: bool) -> float:
    """Bisection on [0, 1] for f(p) = target, f monotone: independent of the code under test."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _brute_force_interval(a: int, ta: float, b: int, tb: float) -> tuple[float, float]:
    """The exact conditional interval from its definition: Clopper-Pearson bounds found by summing binomial terms
    (P(X >= a | pL) = 2.5 %, P(X <= a | pU) = 2.5 %), then r = p / (1 - p) * tb / ta."""
    n = a + b
    p_lo = 0.0 if a == 0 else _solve(lambda p: _binom_tail_ge(a, n, p), 0.025, increasing=True)
    p_hi = 1.0 if a == n else _solve(lambda p: 1 - _binom_tail_ge(a + 1, n, p), 0.025, increasing=False)

    def to_r(p: float) -> float:
        return math.inf if p >= 1 else p / (1 - p) * tb / ta

    return to_r(p_lo), to_r(p_hi)


@pytest.mark.parametrize(("a", "ta", "b", "tb"), [
    (1, 1.0, 0, 1.0), (3, 1.0, 0, 1.0), (0, 2.0, 4, 1.5), (5, 1.0, 5, 1.0), (2, 0.5, 7, 3.0), (12, 4.0, 30, 5.0),
    (1, 1.0, 1, 10.0),
])
def test_rate_ratio_interval_matches_brute_force_summation(a: int, ta: float, b: int, tb: float) -> None:
    """GIVEN hang counts over serving hours WHEN the rate-ratio interval is computed (beta quantiles) THEN it equals
    the one found by summing binomial tails term by term and mapping p onto the ratio."""
    rr = rate_ratio(a, ta, b, tb)
    lo, hi = _brute_force_interval(a, ta, b, tb)
    assert rr.low == pytest.approx(lo, rel=1e-7, abs=1e-12)
    assert rr.high == pytest.approx(hi, rel=1e-7) if math.isfinite(hi) else math.isinf(rr.high)
    if b:
        assert rr.ratio == pytest.approx((a / ta) / (b / tb))


def test_rate_ratio_known_values() -> None:
    """GIVEN counts with closed forms WHEN computed THEN Clopper-Pearson's textbook values come back: x = 5 of 10 gives
    p in [0.18709, 0.81291] (ratio [0.23010, 4.34583] at equal exposure); only the candidate hanging (a of a) gives
    pL = 0.025 ** (1 / a); nothing at all gives no estimate and the interval (0, inf)."""
    rr = rate_ratio(5, 1.0, 5, 1.0)
    assert (rr.ratio, rr.low, rr.high) == pytest.approx((1.0, 0.18709 / 0.81291, 0.81291 / 0.18709), rel=1e-4)
    for a in (1, 3, 6):
        pl = 0.025 ** (1 / a)
        one = rate_ratio(a, 2.0, 0, 1.0)
        assert one.low == pytest.approx(pl / (1 - pl) / 2.0) and math.isinf(one.high) and math.isinf(one.ratio or 0)
    none = rate_ratio(0, 1.0, 0, 1.0)
    assert none.ratio is None and none.low == 0 and math.isinf(none.high)
    assert none.to_json() == {"ratio": None, "ci_low": 0.0, "ci_high": None, "ratio_infinite": False}
    with pytest.raises(ValueError):
        rate_ratio(1, 0.0, 0, 1.0)


def test_rate_rule_fails_identical_arms_at_most_2_5_percent() -> None:
    """GIVEN identical arms (equal exposure, the same true hang rate) WHEN every outcome (a, b) of two Poisson counts is
    weighed by its probability THEN the gate FAILs with probability at most 2.5 % at any rate (the old rule, FAIL when
    the candidate hung once more, failed them up to about half the time); and 6 hangs against none FAIL."""
    for lam in (0.1, 0.5, 1.0, 3.0, 8.0):
        pois = [math.exp(-lam) * lam**k / math.factorial(k) for k in range(40)]
        fail = old = 0.0
        for a, pa in enumerate(pois):
            for b, pb in enumerate(pois):
                if judge_rate(rate_ratio(a, 1.0, b, 1.0), 1.0) is Outcome.FAIL:
                    fail += pa * pb
                if a > b:
                    old += pa * pb
        assert fail <= 0.025, (lam, fail)
        assert old > 0.08
    assert judge_rate(rate_ratio(0, 1.0, 0, 1.0), 1.0) is Outcome.PASS  # no hang anywhere: SHIP stays reachable
    assert judge_rate(rate_ratio(1, 1.0, 0, 1.0), 1.0) is Outcome.INCONCLUSIVE  # hung more, not significantly
    assert judge_rate(rate_ratio(6, 1.0, 0, 1.0), 1.0) is Outcome.FAIL
    assert judge_rate(rate_ratio(2, 1.0, 0, 100.0), 1.0) is Outcome.FAIL  # a long clean baseline counts
    assert judge_rate(rate_ratio(1, 1.0, 2, 1.0), 1.0) is Outcome.PASS
