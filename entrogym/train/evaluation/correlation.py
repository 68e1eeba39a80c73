"""How a run's final accuracy goes with the entropy it experienced: the paper's Figure 1 claim.

Figure 1 (right) of the paper plots each checkpoint's test accuracy against the cumulative
entropy experienced up to it, and reads a rising trend: runs that kept more entropy end more
accurate. :func:`correlation_of` puts a number on that trend over a set of runs, one point per
run (``entrogym.train.evaluation.plots.accuracy_entropy_correlation`` takes each run's last evaluated
checkpoint), so that one run's many checkpoints do not outweigh the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's product-moment correlation, cov(x, y) / (std(x) std(y)).

    NaN when either series is constant (the correlation is undefined), as in
    ``scipy.stats.pearsonr``.
    """
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"pearson: needs two series of one length >= 2, got {x.size}, {y.size}")
    dx, dy = x - x.mean(), y - y.mean()
    denom = float(np.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / denom) if denom > 0 else float("nan")


def average_ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of the ranks they span (the rule Spearman's rho uses)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks (Spearman
    1904; the tie rule of ``scipy.stats.spearmanr``)."""
    return pearson(average_ranks(xs), average_ranks(ys))


@dataclass(frozen=True)
class Correlation:
    """Final accuracy against cumulative entropy over ``runs`` (one point per run)."""

    runs: int
    pearson: float
    spearman: float
    points: tuple[tuple[str, float, float], ...]  # (run folder, cumulative entropy, accuracy)

    def line(self) -> str:
        return (
            f"final accuracy vs cumulative entropy over {self.runs} runs: "
            f"Pearson r = {self.pearson:.2f}, Spearman rho = {self.spearman:.2f}"
        )


def correlation_of(points: list[tuple[str, float, float]]) -> Correlation | None:
    """The correlation over ``(run, cumulative entropy, accuracy)`` points, one per run; None
    with fewer than 3 (too few points to mean anything)."""
    if len(points) < 3:
        return None
    xs, ys = [p[1] for p in points], [p[2] for p in points]
    return Correlation(len(points), pearson(xs, ys), spearman(xs, ys), tuple(points))
