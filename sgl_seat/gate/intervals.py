"""The battery's statistics: paired log-ratios with a Student-t interval, the three-way gate, the crossover.

Why paired log-ratios: arms run interleaved (ABBA), so repetition ``r`` of the candidate and of the baseline
share whatever drifted on the machine around them; the log of their ratio cancels that drift and a multiplicative
effect becomes additive. With ``n`` repetitions the interval is ``exp(mean +/- t(0.975, n-1) * sd / sqrt(n))``:
at n = 3 that is t = 4.30, wide on purpose (bench-anchors section 3: three runs cannot prove a small change).

A gate then says PASS when the whole interval clears its threshold, FAIL when the whole interval misses it, and
INCONCLUSIVE otherwise (Pinpoint's three-way answer); more repetitions narrow the interval. The crossover
concurrency, where the draft stops paying, is where the ratio curve crosses 1 (interpolated in log concurrency),
bracketed by where the interval's two edges cross 1.

Hangs are counts, not paired measurements: :func:`rate_ratio` gives the candidate's hang rate (per hour of serving
time) over the baseline's with an exact conditional interval, and :func:`judge_rate` turns it into the same three
answers (its docstring says why its PASS differs from :func:`judge`'s).

No scipy: the t quantile is the inverse of the t CDF through the regularized incomplete beta function, checked
against tabulated values in the unit tests; the beta quantile behind the rate-ratio interval inverts the same
function, checked against binomial tails summed term by term.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Crossover", "Interval", "Outcome", "RateRatio", "band_of", "beta_quantile", "crossover", "judge", "judge_rate",
    "paired_log_ratio", "rate_ratio", "t_quantile",
]

LEVEL = 0.95


class Outcome(str, Enum):
    PASS = "PASS"  # noqa: S105 (an outcome, not a password)
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 3e-16:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on the CDF; 0 < p < 1, df > 0)."""
    if not (0.0 < p < 1.0 and df > 0):
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class Interval:
    """A ratio (candidate / baseline) with its two-sided interval, from ``n`` paired log-ratios."""

    ratio: float
    low: float
    high: float
    n: int
    log_sd: float  # the sample SD of the paired log-ratios (0 when n < 2)

    @property
    def half_width(self) -> float:
        """Half the interval's width in log space, as a ratio (0.05 = +/- about 5 %)."""
        if self.n < 2 or not math.isfinite(self.high) or self.low <= 0:
            return math.inf
        return math.expm1((math.log(self.high) - math.log(self.low)) / 2.0)

    def to_json(self) -> dict[str, float | int | None]:
        def f(x: float) -> float | None:
            return round(x, 6) if math.isfinite(x) else None

        return {"ratio": f(self.ratio), "ci_low": f(self.low), "ci_high": f(self.high), "n": self.n,
                "log_sd": f(self.log_sd)}


def paired_log_ratio(base: Sequence[float], cand: Sequence[float], level: float = LEVEL) -> Interval:
    """Pair ``cand[i]`` with ``base[i]`` (same repetition) and return the ratio with its ``level`` interval.

    A single pair gives the ratio with an unbounded interval (0, inf): one run says nothing about noise.
    Values must be positive (throughputs, latencies, pool sizes).
    """
    if len(base) != len(cand) or not base:
        raise ValueError(f"paired_log_ratio needs equal, non-empty samples (got {len(base)} and {len(cand)})")
    if any(not (v > 0 and math.isfinite(v)) for v in (*base, *cand)):
        raise ValueError("paired_log_ratio needs positive finite values")
    d = [math.log(c) - math.log(b) for b, c in zip(base, cand, strict=True)]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return Interval(math.exp(mean), 0.0, math.inf, n, 0.0)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, sd)


def judge(iv: Interval, threshold: float, *, higher_is_better: bool) -> Outcome:
    """PASS when the interval clears ``threshold`` entirely, FAIL when it misses it entirely, else INCONCLUSIVE."""
    if higher_is_better:
        if iv.low >= threshold:
            return Outcome.PASS
        if iv.high < threshold:
            return Outcome.FAIL
        return Outcome.INCONCLUSIVE
    if iv.high <= threshold:
        return Outcome.PASS
    if iv.low > threshold:
        return Outcome.FAIL
    return Outcome.INCONCLUSIVE


def beta_quantile(q: float, a: float, b: float) -> float:
    """The ``q`` quantile of the Beta(``a``, ``b``) distribution (bisection on the regularized incomplete beta)."""
    if not (0.0 < q < 1.0 and a > 0 and b > 0):
        raise ValueError(f"beta_quantile needs 0 < q < 1 and a, b > 0, got q={q}, a={a}, b={b}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _betai(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class RateRatio:
    """Events per unit of exposure, candidate over baseline, with an exact two-sided interval.

    ``ratio`` is ``None`` when neither arm had an event (0/0 says nothing) and ``inf`` when only the candidate had
    one; ``low`` is 0 when the candidate had none and ``high`` is ``inf`` when the baseline had none.
    """

    ratio: float | None
    low: float
    high: float
    events: int
    base_events: int
    exposure: float
    base_exposure: float

    def to_json(self) -> dict[str, float | int | None]:
        def f(x: float | None) -> float | None:
            return round(x, 6) if x is not None and math.isfinite(x) else None

        return {"ratio": f(self.ratio), "ci_low": f(self.low), "ci_high": f(self.high),
                "ratio_infinite": self.ratio is not None and math.isinf(self.ratio)}


def rate_ratio(events: int, exposure: float, base_events: int, base_exposure: float,
               level: float = LEVEL) -> RateRatio:
    """The rate ratio ``(events / exposure) / (base_events / base_exposure)`` with its exact ``level`` interval.

    Why this interval: given ``n = events + base_events``, the candidate's count is binomial with ``p = te * r /
    (te * r + tb)`` (``te``, ``tb`` the exposures, ``r`` the true ratio), whatever the baseline's own rate is. A
    Clopper-Pearson interval on ``p`` (never below its level, however few the events) maps one to one onto ``r =
    p / (1 - p) * tb / te``. Few hangs give a wide interval, and a long baseline exposure without a hang narrows it:
    both arms' serving time counts, not only the counts.
    """
    if events < 0 or base_events < 0 or not (exposure > 0 and base_exposure > 0):
        raise ValueError(f"rate_ratio needs counts >= 0 and positive exposures, got {events}/{exposure}, "
                         f"{base_events}/{base_exposure}")
    n = events + base_events
    if n == 0:
        return RateRatio(None, 0.0, math.inf, 0, 0, exposure, base_exposure)
    alpha = 1.0 - level
    scale = base_exposure / exposure

    def to_r(p: float) -> float:
        return math.inf if p >= 1.0 else p / (1.0 - p) * scale

    p_low = 0.0 if events == 0 else beta_quantile(alpha / 2.0, events, n - events + 1)
    p_high = 1.0 if events == n else beta_quantile(1.0 - alpha / 2.0, events + 1, n - events)
    ratio = math.inf if base_events == 0 else (events / exposure) / (base_events / base_exposure)
    return RateRatio(ratio, to_r(p_low), to_r(p_high), events, base_events, exposure, base_exposure)


def judge_rate(rr: RateRatio, bound: float) -> Outcome:
    """FAIL when the whole interval is above ``bound``; PASS when the estimate is at or below it; else INCONCLUSIVE.

    Why PASS is not :func:`judge`'s (the whole interval below the bound): hangs are rare, and a battery where
    neither arm hangs has the interval (0, inf), so a battery could never SHIP. Here PASS means the candidate hung
    no more often per hour than the bound allows; a candidate that hung more often, but not so much more that the
    interval clears the bound, is INCONCLUSIVE (which still stops SHIP: more runs decide). FAIL needs the interval
    above the bound, so on identical arms (ratio 1, bound >= 1) it comes out FAIL with probability at most
    ``(1 - LEVEL) / 2``, whatever the hang rate, instead of whenever one arm happened to hang once more.
    """
    if rr.low > bound:
        return Outcome.FAIL
    if rr.ratio is None or rr.ratio <= bound:
        return Outcome.PASS
    return Outcome.INCONCLUSIVE


def band_of(iv: Interval) -> str:
    """Whether the draft pays at one concurrency: ``on`` (interval above 1), ``off`` (below 1), else ``either``."""
    if iv.low > 1.0:
        return "on"
    if iv.high < 1.0:
        return "off"
    return "either"


@dataclass(frozen=True, slots=True)
class Crossover:
    """Concurrency where the candidate/baseline throughput ratio falls through 1, with its bracket.

    ``None`` with ``below_sweep``: the draft already loses at the smallest level; with ``beyond_sweep``: it still
    pays at the largest. ``low``/``high`` are where the interval's lower and upper edges fall through 1, each
    followed from the first level where it is at or above 1 (``None``: that edge does not fall through 1 inside
    the sweep).
    """

    estimate: float | None
    low: float | None
    high: float | None
    below_sweep: bool
    beyond_sweep: bool

    def to_json(self) -> dict[str, float | bool | None]:
        def f(x: float | None) -> float | None:
            return None if x is None else round(x, 2)

        return {"estimate": f(self.estimate), "ci_low": f(self.low), "ci_high": f(self.high),
                "below_sweep": self.below_sweep, "beyond_sweep": self.beyond_sweep}


def _first_crossing(levels: Sequence[float], values: Sequence[float]) -> float | None:
    """The first concurrency where ``values`` goes from >= 1 to < 1, interpolated in log-log space."""
    for i in range(1, len(levels)):
        a, b = values[i - 1], values[i]
        if a >= 1.0 > b:
            if not math.isfinite(a) or b <= 0:  # an unbounded edge: it crosses by the next level at the latest
                return float(levels[i])
            la, lb = math.log(levels[i - 1]), math.log(levels[i])
            ya, yb = math.log(a), math.log(b)
            frac = ya / (ya - yb) if ya != yb else 0.0
            return math.exp(la + frac * (lb - la))
    return None


def crossover(levels: Sequence[int], ivs: Sequence[Interval]) -> Crossover:
    """Where the draft stops paying, from each level's candidate/baseline interval (levels ascending)."""
    if len(levels) != len(ivs) or not levels:
        raise ValueError("crossover needs one interval per level")
    if list(levels) != sorted(levels) or levels[0] < 1:
        raise ValueError(f"crossover needs ascending levels >= 1, got {list(levels)}")
    ratios = [iv.ratio for iv in ivs]
    below = ratios[0] < 1.0
    beyond = all(r >= 1.0 for r in ratios)
    est = None if below or beyond else _first_crossing(levels, ratios)
    # The lower edge crosses 1 first (the earliest the draft may stop paying), the upper edge last. Each edge is
    # followed from the first level where it is at or above 1: an interval that straddles 1 at the smallest level
    # (one request per client there is the noisiest cell) and clears it at the next says the draft pays from there,
    # and the fall after it is still the crossing; an edge never at or above 1 does not cross (None).
    low = _edge_crossing(levels, [iv.low for iv in ivs])
    high = _edge_crossing(levels, [iv.high if math.isfinite(iv.high) else math.inf for iv in ivs])
    return Crossover(est, low, high, below, beyond)


def _edge_crossing(levels: Sequence[int], edge: Sequence[float]) -> float | None:
    start = next((i for i, v in enumerate(edge) if v >= 1.0), None)
    return None if start is None else _first_crossing(levels[start:], edge[start:])
