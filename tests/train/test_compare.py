"""`entrogym compare`: runs side by side, means over seeds with 95 % intervals, the claims."""

from __future__ import annotations

import json

import pytest
from run_folders import write_run
from scipy import stats

from entrogym.cli import main as entrogym_main
from entrogym.train.evaluation.compare import (
    check_claim,
    compare,
    format_report,
    parse_claim,
    signal_lost_at,
    summarize_run,
    tracking_excursion,
)
from entrogym.train.evaluation.interval import mean_interval, t_cdf, t_quantile


@pytest.mark.parametrize("df", [1, 2, 3, 5, 8, 13, 30, 100])
def test_t_quantile_and_cdf_match_scipy(df):
    assert t_quantile(0.975, df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)
    assert t_quantile(0.9, df) == pytest.approx(stats.t.ppf(0.9, df), rel=1e-9)
    for x in (-3.0, -0.4, 0.0, 1.7):
        assert t_cdf(x, df) == pytest.approx(stats.t.cdf(x, df), abs=1e-10)


def test_mean_interval_is_scipys_t_interval():
    values = [0.10, 0.35, 0.20, 0.05, 0.30, 0.15]
    got = mean_interval(values)
    low, high = stats.t.interval(
        0.95, len(values) - 1, loc=sum(values) / 6, scale=stats.sem(values)
    )
    assert (got.n, got.mean) == (6, pytest.approx(0.19166666666))
    assert (got.low, got.high) == (pytest.approx(low, rel=1e-9), pytest.approx(high, rel=1e-9))
    assert got.above(0) and not got.above(0.1) and not got.below(0.3)
    single = mean_interval([0.4])
    assert single.low is None and not single.above(-1) and "no interval" in single.text()
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])


def test_signal_lost_at_is_the_start_of_the_last_run_without_signal():
    assert signal_lost_at([(0, False), (1, True), (2, False), (3, True), (4, True)]) == 3
    assert signal_lost_at([(0, True), (1, True)]) == 0
    assert signal_lost_at([(0, True), (1, False)]) is None
    assert signal_lost_at([]) is None


def test_tracking_excursion_reads_the_tracked_entropy_from_the_third_iteration():
    rows = [{"entropy": 9.0, "entropy_tracked": h, "entropy_target": t}
            for h, t in [(5.0, None), (1.0, 2.0), (2.2, 2.0), (1.7, 2.0), (2.1, 2.0)]]  # fmt: skip
    # iterations 0 and 1 (the target not yet known, then 50 % off) are the controller's own
    assert tracking_excursion(rows) == pytest.approx(0.15)
    assert tracking_excursion([{"entropy": 1.0, "entropy_target": None}]) is None
    untracked = [{"entropy": h, "entropy_target": 1.0} for h in (1.0, 1.0, 1.3)]
    assert tracking_excursion(untracked) == pytest.approx(0.3)


@pytest.fixture
def world(tmp_path):
    """Three seeds of `grpo` and `repo-r`: repo-r ends higher on every seed, by 0.15-0.2."""
    dirs = []
    for seed, (g, r) in enumerate([(0.4, 0.55), (0.3, 0.5), (0.5, 0.68)]):
        for label, final, decay in (("grpo", g, 0.5), ("repo-r", r, 0.9)):
            d = tmp_path / f"{label}-s{seed}"
            write_run(d, seed=seed, entropies=[2.0 * decay**i for i in range(4)],
                       evals={0: 0.1, 3: final}, zero_adv=[0, 4, 0, 4] if label == "grpo" else None,
                       dependence={0: 1.2, 2: 1.0 + final}, challenge=final / 10)  # fmt: skip
            dirs.append(d)
    return dirs


def test_summarize_run_reads_every_measure(world):
    run = summarize_run(world[0])
    assert (run.label, run.seed, run.iterations, run.final_iteration) == ("grpo", 0, 4, 3)
    assert (run.final_accuracy, run.best_accuracy, run.challenge) == (0.4, 0.4, pytest.approx(0.04))
    assert (run.entropy_first, run.entropy_last, run.entropy_min) == (2.0, 0.25, 0.25)
    assert run.entropy_drop == pytest.approx(1.75)
    assert run.cumulative_entropy == pytest.approx(2.0 + 1.0 + 0.5 + 0.25)
    assert run.entropy_by_turn == {"1": 0.125, "2": 0.25}
    assert (run.no_signal_iterations, run.signal_lost_at) == (2, 3)
    assert (run.input_dependence_first, run.input_dependence_last) == (1.2, 1.4)
    assert run.tracking_excursion is None  # no target in its rows


def test_a_run_without_a_controller_reports_no_tracking(world):
    """The trainer logs every run's first entropy as ``entropy_target`` (to report the drift
    from it); only a run whose saved config has a controller tracked a target."""
    folder = world[0]
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    with (folder / "metrics.jsonl").open("w") as out:
        for row in rows:
            out.write(json.dumps({**row, "entropy_target": 2.0}) + "\n")
    config = folder / "config.yaml"
    config.write_text("algo:\n  name: gspo\n  controller: null\nseed: 0\n")
    assert summarize_run(folder).tracking_excursion is None
    config.write_text("algo:\n  name: repo-r\n  controller:\n    name: doubling\nseed: 0\n")
    assert summarize_run(folder).tracking_excursion == pytest.approx(0.875)


def test_claims_pair_by_seed_and_read_the_interval(world):
    runs = [summarize_run(d) for d in world]
    claim = check_claim("repo-r>grpo:final_accuracy", runs)
    diffs = [0.15, 0.2, 0.18]
    low, high = stats.t.interval(0.95, 2, loc=sum(diffs) / 3, scale=stats.sem(diffs))
    assert claim.seeds == [0, 1, 2] and claim.verdict == "shows"
    assert (claim.difference.low, claim.difference.high) == (
        pytest.approx(low),
        pytest.approx(high),
    )
    assert check_claim("grpo>repo-r:final_accuracy", runs).verdict == "reversed"
    assert check_claim("grpo>repo-r:challenge", runs).verdict == "reversed"
    assert check_claim("adapo>dapo:final_accuracy", runs).verdict == "not run (adapo, dapo)"
    two = [r for r in runs if r.seed != 2]
    one = [r for r in runs if r.seed == 0]
    assert check_claim("repo-r>grpo:final_accuracy", one).verdict == "too few seeds (1)"
    # seeds 0, 1: differences 0.15 and 0.2, an interval of +-12.7 * 0.025 spans 0
    assert check_claim("repo-r>grpo:final_accuracy", two).verdict == "unclear"


def test_compare_groups_configurations_and_correlates_over_runs(world):
    result = compare(world)
    groups = {g["label"]: g for g in result["groups"]}
    assert groups["grpo"]["seeds"] == [0, 1, 2]
    assert groups["repo-r"]["final_accuracy"]["mean"] == pytest.approx(1.73 / 3)
    assert groups["grpo"]["no_signal_mean"] == 2.0
    finals = [r["final_accuracy"] for r in result["runs"]]
    dependence = [r["input_dependence_last"] for r in result["runs"]]
    corr = result["correlations"]["input_dependence_last"]
    assert corr["runs"] == 6
    assert corr["pearson"] == pytest.approx(stats.pearsonr(dependence, finals)[0])
    cumulative = [r["cumulative_entropy"] for r in result["runs"]]
    assert result["correlations"]["cumulative_entropy"]["spearman"] == pytest.approx(
        stats.spearmanr(cumulative, finals)[0]
    )
    text = format_report(result)
    assert "repo-r>grpo:final_accuracy" in text and "shows" in text
    assert "0.577 [" in text  # repo-r's mean with its interval


def test_bad_claims_are_refused_with_the_form():
    assert parse_claim(" held > grpo : final_accuracy ") == ("held", "grpo", "final_accuracy")
    for bad in ("held>grpo", "held>grpo:speed", "held:grpo:final_accuracy"):
        with pytest.raises(ValueError, match="A>B:MEASURE"):
            parse_claim(bad)


def test_cli_prints_writes_json_and_refuses_bad_input_in_one_line(world, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert entrogym_main(["compare", *map(str, world), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "claims (paired by seed" in printed
    saved = json.loads((out / "compare.json").read_text())
    assert [c["text"] for c in saved["claims"]][1] == "repo-r>grpo:final_accuracy"
    assert entrogym_main(["compare", str(world[0]), "--claims", "a>b:speed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "A>B:MEASURE" in err
    assert entrogym_main(["compare", str(tmp_path / "nothing")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
