"""Labelled preset variants of the bandit lab ("repo-r (zeta_max=0.5)")."""

from __future__ import annotations

import pytest

from entrogym.algos.presets import ALGORITHMS
from entrogym.theory.lab import LabConfig, run_one
from entrogym.theory.variants import get_algorithm, parse_variant, preset_knobs, variant_label


def test_a_label_resolves_to_the_preset_with_its_knobs() -> None:
    config = get_algorithm("adapo (epochs=8 minibatch_size=32 eps_high_max=1.0)")
    assert (config.name, config.epochs, config.minibatch_size) == ("adapo", 8, 32)
    assert config.eps_high_max == 1.0 and config.eps_low == ALGORITHMS["adapo"].eps_low
    assert get_algorithm("grpo") == ALGORITHMS["grpo"]
    assert parse_variant("repo-r (zeta_max=0.5, minibatch_size=none)") == (
        "repo-r",
        {"zeta_max": 0.5, "minibatch_size": None},
    )
    assert parse_variant(variant_label("repo-d", {"zeta_max": 0.5})) == (
        "repo-d",
        {"zeta_max": 0.5},
    )


def test_control_knobs_apply_only_to_their_presets() -> None:
    assert "zeta_max" in preset_knobs("repo-r") and "zeta_max" not in preset_knobs("grpo")
    assert "eps_high_max" in preset_knobs("adapo") and "eps_high_max" not in preset_knobs("dapo")
    with pytest.raises(ValueError, match="eps_high_max"):
        get_algorithm("grpo (eps_high_max=1.0)")
    with pytest.raises(ValueError, match="cannot read"):
        get_algorithm("repo-r (zeta_max=big)")
    with pytest.raises(ValueError, match="algos"):
        LabConfig(algos=["repo-r (zeta=1)"]).validate()


def test_a_variant_without_changes_runs_like_its_preset() -> None:
    lab = LabConfig(iters=3, n_states=4, n_arms=6, samples_per_state=4)
    _, plain = run_one("repo-r", 0, lab)
    _, same = run_one("repo-r (zeta_max=0.05)", 0, lab)
    _, other = run_one("repo-r (zeta_max=0.5 zeta_init=0.5)", 0, lab)
    assert [r["entropy"] for r in plain] == [r["entropy"] for r in same]
    assert [r["entropy"] for r in plain] != [r["entropy"] for r in other]
