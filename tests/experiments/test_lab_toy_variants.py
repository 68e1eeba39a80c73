"""`entrogym bandit` defaults: the toy-scaled variants hold entropy where GRPO loses half."""

from __future__ import annotations

from entrogym.algos.presets import ALGORITHMS
from entrogym.commands.bandit import BanditOptions
from entrogym.commands.lab_runs import TOY_VARIANTS, lab_config
from entrogym.experiments.lab import run_lab
from entrogym.experiments.lab_report import HOLD_TOLERANCE, format_table


def test_defaults_run_paper_presets_then_toy_variants() -> None:
    options = BanditOptions()
    assert options.algos == [*ALGORITHMS, *TOY_VARIANTS]
    assert [run.label for run in options.lab().algos] == options.algos  # labels as given


def test_each_controller_variant_holds_while_grpo_loses_half() -> None:
    summary = run_lab(lab_config(["grpo", *TOY_VARIANTS]))
    claims = summary["claims"]
    assert claims["grpo_loses_half"]["holds"]
    assert claims[f"{TOY_VARIANTS[0]}_loses_half"]["holds"]
    for label in TOY_VARIANTS[1:]:
        claim = claims[f"{label}_holds_entropy"]
        assert claim["holds"], (label, claim)
        assert abs(claim["final_over_initial"] - 1) <= HOLD_TOLERANCE
        assert 0 < claim["reward_cost_vs_grpo"] < 0.1  # entropy is bought with some reward
    table = format_table(summary)
    assert all(label in table for label in TOY_VARIANTS)
