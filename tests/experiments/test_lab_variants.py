"""Labelled variants of the bandit lab, in the one spelling of algorithms
("repo-d --algo.controller pi --algo.controller.kp 0.3"), and lab-wide algorithm options."""

from __future__ import annotations

import pytest

from entrogym.algos.presets import ALGORITHMS
from entrogym.commands.lab_runs import entry_label, lab_config, lab_run
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig


def test_an_entry_resolves_to_the_preset_with_its_options() -> None:
    config = lab_run(
        "adapo --algo.epochs 8 --algo.minibatch-size 32 --algo.controller.max 1.0"
    ).algorithm
    assert (config.name, config.epochs, config.minibatch_size) == ("adapo", 8, 32)
    assert config.controller.params.max == 1.0
    assert config.loss == ALGORITHMS["adapo"].loss
    assert lab_run("grpo").algorithm == ALGORITHMS["grpo"]
    # spacing and = are normalised in the label tables and files show
    assert entry_label("repo-d  --algo.controller=pi") == "repo-d --algo.controller pi"


def test_bad_entries_are_named() -> None:
    with pytest.raises(ValueError, match="algos: 'grpo --algo.controller pi': .*no lever"):
        lab_config(["grpo --algo.controller pi"])
    with pytest.raises(ValueError, match="cannot read 'big' as float"):
        lab_config(["repo-r --algo.controller.max big"])
    with pytest.raises(ValueError, match="algo.zeta is not an algorithm option"):
        lab_config(["repo-r --algo.zeta 1"])


def test_lab_wide_options_apply_to_the_presets_with_a_lever() -> None:
    pi = {"controller": {"name": "pi"}}
    lab = lab_config(["grpo", "repo-d", "repo-d --algo.controller paper"], pi)
    grpo, repo_d, own = (run.algorithm for run in lab.algos)
    assert grpo.controller is None  # no lever: controller options skip it
    assert repo_d.controller.name == "pi"
    assert own.controller.name == "paper"  # an entry's own option wins
    # the labels are the entries' own: lab-wide options are not part of them
    assert [run.label for run in lab.algos][:2] == ["grpo", "repo-d"]
    with pytest.raises(ValueError, match="none of grpo, dapo has one"):
        lab_config(["grpo", "dapo"], pi)
    named = lab_run("grpo", {"lever": {"name": "repo-d"}})
    assert named.algorithm.lever.name == "repo-d"  # naming a lever adds it to all


def test_a_variant_without_changes_runs_like_its_preset() -> None:
    lab = LabConfig(iters=3, n_states=4, n_arms=6, samples_per_state=4)
    _, plain = run_one(lab_run("repo-r"), 0, lab)
    _, same = run_one(lab_run("repo-r --algo.controller.max 0.05"), 0, lab)
    _, other = run_one(
        lab_run("repo-r --algo.controller.max 0.5 --algo.controller.init 0.5"), 0, lab
    )
    assert [r["entropy"] for r in plain] == [r["entropy"] for r in same]
    assert [r["entropy"] for r in plain] != [r["entropy"] for r in other]
    assert plain[0]["algo"] == "repo-r" and other[0]["algo"].startswith("repo-r --algo.")
