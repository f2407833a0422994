"""Confidence intervals for the rates an evaluation reports, and the quantiles benches and probes print.

`wilson_interval` is the Wilson score interval of a binomial proportion: unlike the normal approximation it
stays inside [0, 1] and does not collapse to a point at 0 or n successes, which matters for the small samples
and the 0% and 100% rates evaluations often show. `successes` may be fractional (a mean score in [0, 1] times
n): the interval is then the same formula applied to that mean, an approximation that treats each episode's
score as if it were a success probability.
"""
from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of `values` (q in [0, 1]); nan when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The (low, high) Wilson score interval for `successes` out of `n` (z = 1.96: 95%). n = 0 gives (0, 1)."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)
