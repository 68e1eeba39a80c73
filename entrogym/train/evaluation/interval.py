"""A mean over seeds with its 95 % interval: how results across seeds are stated.

Goals are stated as "the mean over >= N seeds, with a 95 % interval above 0". The interval is
Student's t interval for a mean, ``mean +- t_{0.975, n-1} * s / sqrt(n)`` (Student 1908; any
statistics text, e.g. Wasserman, *All of Statistics*, 2004, section 10.4), with ``s`` the sample
standard deviation. The t quantile is computed here (numerical integration of the t density
and bisection) so that the package does not need scipy at run time; the tests check it
against ``scipy.stats.t.ppf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Simpson panels for the t density on [0, x]: the density is smooth, and 4,000 panels give
# the CDF to ~1e-12 for every x a 95 % interval needs (x < 13).
_PANELS = 4000


def t_density(x: float, df: int) -> float:
    """Student's t density with ``df`` degrees of freedom."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom (Simpson's rule on [0, |x|])."""
    if df < 1:
        raise ValueError(f"t_cdf: df must be >= 1, got {df}")
    a = abs(x)
    h = a / _PANELS
    total = t_density(0.0, df) + t_density(a, df)
    for k in range(1, _PANELS):
        total += (4 if k % 2 else 2) * t_density(k * h, df)
    half = total * h / 3  # P(0 <= T <= |x|)
    return 0.5 + half if x >= 0 else 0.5 - half


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, for 0.5 <= p < 1."""
    if not 0.5 <= p < 1:
        raise ValueError(f"t_quantile: p must be in [0.5, 1), got {p}")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:  # t_{0.975, 1} is 12.7: a few doublings
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with its two-sided interval at ``level`` (None below 2 values)."""

    n: int
    mean: float
    low: float | None
    high: float | None
    level: float = 0.95

    def above(self, threshold: float = 0.0) -> bool:
        """The whole interval lies above ``threshold`` (False without an interval)."""
        return self.low is not None and self.low > threshold

    def below(self, threshold: float = 0.0) -> bool:
        """The whole interval lies below ``threshold`` (False without an interval)."""
        return self.high is not None and self.high < threshold

    def text(self, digits: int = 3, signed: bool = True) -> str:
        """``mean [low, high] (n=N, 95%)``; signs shown when ``signed`` (differences)."""
        fmt = f"{'+' if signed else ''}.{digits}f"
        if self.low is None or self.high is None:
            return f"{self.mean:{fmt}} (n={self.n}, no interval)"
        return (
            f"{self.mean:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}] "
            f"(n={self.n}, {self.level:.0%})"
        )


def mean_interval(values: list[float], level: float = 0.95) -> Interval:
    """The mean of ``values`` with Student's t interval at ``level`` (no interval for n < 2)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values")
    mean = sum(values) / n
    if n < 2:
        return Interval(n, mean, None, None, level)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half, level)
