"""Final accuracy against cumulative entropy: the statistics, checked against scipy, and the
number `entrogym plot` prints and writes."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from entrogym.cli import main as entrogym_main
from entrogym.train.evaluation.correlation import average_ranks, pearson, spearman
from entrogym.train.evaluation.plots import accuracy_entropy_correlation, load_run
from entrogym.train.folder.metrics import MetricsLogger

XS = [0.3, 1.7, 1.7, 4.0, 2.2, 9.1, 0.3]
YS = [0.10, 0.35, 0.20, 0.80, 0.35, 0.95, 0.15]


def test_pearson_and_spearman_match_scipy_with_ties():
    assert pearson(XS, YS) == pytest.approx(stats.pearsonr(XS, YS).statistic, abs=1e-12)
    assert spearman(XS, YS) == pytest.approx(stats.spearmanr(XS, YS).statistic, abs=1e-12)
    assert average_ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


def test_a_monotone_curve_has_rank_correlation_one_but_not_pearson_one():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    ys = [math.exp(x) for x in xs]
    assert spearman(xs, ys) == pytest.approx(1.0)
    assert pearson(xs, ys) < 0.95
    assert math.isnan(pearson(xs, [1.0] * 5))  # a constant series: undefined
    with pytest.raises(ValueError, match="length"):
        pearson([1.0], [2.0])


def _write_run(path, algo: str, entropies: list[float], accuracy: float) -> None:
    total = 0.0
    with MetricsLogger(path, tensorboard=False) as log:
        for it, h in enumerate(entropies, start=1):
            total += h
            log.log({"iteration": it, "algo": algo, "entropy": h, "cumulative_entropy": total},
                    step=it)  # fmt: skip
        # an early eval, then the final one: only the final point counts
        log.log({"kind": "eval", "iteration": 1, "algo": algo, "accuracy": 0.0}, step=1)
        log.log({"kind": "eval", "iteration": len(entropies), "algo": algo,
                 "accuracy": accuracy}, step=len(entropies))  # fmt: skip


def test_one_point_per_run_at_its_last_checkpoint(tmp_path, capsys):
    spec = {"a": ([1.0, 0.5, 0.1], 0.3), "b": ([1.0, 1.0, 1.0], 0.6), "c": ([2.0, 2.0, 1.5], 0.5),
            "d": ([0.2, 0.1, 0.1], 0.2)}  # fmt: skip
    dirs = []
    for name, (hs, acc) in spec.items():
        _write_run(tmp_path / name, name, hs, acc)
        dirs.append(tmp_path / name)
    corr = accuracy_entropy_correlation([load_run(d) for d in dirs])
    assert corr is not None and corr.runs == 4
    xs = [sum(hs) for hs, _ in spec.values()]
    ys = [acc for _, acc in spec.values()]
    assert [p[1] for p in corr.points] == pytest.approx(xs)
    assert corr.pearson == pytest.approx(stats.pearsonr(xs, ys).statistic)
    assert corr.spearman == pytest.approx(stats.spearmanr(xs, ys).statistic)
    assert accuracy_entropy_correlation([load_run(d) for d in dirs[:2]]) is None

    assert entrogym_main(["plot", *map(str, dirs), "--out", str(tmp_path / "fig")]) == 0
    out = capsys.readouterr().out
    assert f"over 4 runs: Pearson r = {corr.pearson:.2f}" in out
    written = json.loads((tmp_path / "fig" / "correlation.json").read_text())
    assert written["spearman"] == pytest.approx(corr.spearman)
