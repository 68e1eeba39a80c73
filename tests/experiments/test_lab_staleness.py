"""The bandit lab with stale batches (``entrogym bandit --max-staleness K``): iteration i
samples with the policy after update i - K, and the update divides by that policy."""

from __future__ import annotations

import pytest

from entrogym.commands.bandit import cli
from entrogym.commands.lab_runs import lab_run
from entrogym.experiments.lab import run_one
from entrogym.experiments.lab_config import LabConfig

SMALL = dict(iters=3, n_states=8, n_arms=8, samples_per_state=8)


def test_a_stale_lab_run_samples_with_older_policies():
    fresh = run_one(lab_run("grpo"), 0, LabConfig(**SMALL))[1]
    stale = run_one(lab_run("grpo"), 0, LabConfig(**SMALL, max_staleness=1))[1]
    # iteration 0 samples with the initial policy either way
    assert fresh[0] == stale[0]
    assert fresh[0]["entropy"] != fresh[0]["entropy_sampled"]  # update 0 moved the policy
    # from iteration 1 on the batch comes from the policy one update older: another update
    assert fresh[1]["entropy"] != stale[1]["entropy"]
    assert fresh == run_one(lab_run("grpo"), 0, LabConfig(**SMALL, max_staleness=0))[1]


def test_a_negative_staleness_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        LabConfig(**SMALL, max_staleness=-1).validate()
    assert cli(["--max-staleness", "-1", "--out", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
