"""``algo.controller.target_probe``: the target measured on extra batches of the initial policy
before the first update, through ``entrogym train`` on tiny-random-llama with the hf engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrogym.commands.train import cli

RUN = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 16, num_test: 4}",
    "--iterations", "2", "--tasks-per-iter", "2", "--samples", "3",
    "--early-stop-min-per-task", "3", "--max-response-tokens", "6",
    "--algo", "grpo-entropy-bonus", "--algo.controller", "pi",
    # the trainer's probe batches are scored for their sampled entropy
    "--algo.controller.estimator", "sampled",
]  # fmt: skip


def _train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def test_the_target_averages_the_probe_batches_and_the_run_samples_what_it_would_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli([*RUN, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert cli([*RUN, "--algo.controller.target-probe", "3", "--out", str(tmp_path / "probe")]) == 0
    said = capsys.readouterr().out
    found = re.search(
        r"target probe: 3 batches of the initial policy, entropy ([\d., ]+) nats", said
    )
    assert found, said
    probe = [float(x) for x in found.group(1).split(", ")]
    plain, probed = _train_rows(tmp_path / "plain"), _train_rows(tmp_path / "probe")
    # The probe trains on nothing and leaves the run's random stream alone: same samples.
    assert [r["entropy"] for r in probed] == [r["entropy"] for r in plain]
    assert [r["generated_tokens"] for r in probed] == [r["generated_tokens"] for r in plain]
    # Without it the target is the first iteration's entropy; with it, the mean of four batches.
    assert plain[0]["entropy_target"] == plain[0]["entropy"]
    expected = (sum(probe) + probed[0]["entropy"]) / 4
    assert probed[0]["entropy_target"] == pytest.approx(expected, abs=1e-3)  # printed to 3 places
    assert probed[0]["entropy_target"] != probed[0]["entropy"]
    assert len(set(probe)) == 3  # three different draws of tasks and samples


def test_a_negative_probe_is_one_line_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert cli([*RUN, "--algo.controller.target-probe", "-1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("algo.controller.target_probe must be an integer >= 0, got -1"), err
    assert not out.exists()


def _probe_values(said: str) -> list[float]:
    found = re.search(
        r"target probe: \d+ batches of the initial policy, entropy ([\d., ]+) nats", said
    )
    assert found, said
    return [float(x) for x in found.group(1).split(", ")]


def test_an_exact_target_measures_the_probe_batches_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact_run = [a if a != "sampled" else "exact" for a in RUN]
    probe = ["--algo.controller.target-probe", "2"]
    assert cli([*exact_run, *probe, "--out", str(tmp_path / "exact")]) == 0
    exact = _probe_values(capsys.readouterr().out)
    assert cli([*RUN, *probe, "--out", str(tmp_path / "sampled")]) == 0
    sampled = _probe_values(capsys.readouterr().out)
    # the same two batches (same seed), measured by the two estimators
    assert all(abs(e - s) > 1e-3 for e, s in zip(exact, sampled, strict=True))
    first = _train_rows(tmp_path / "exact")[0]
    assert first["entropy_tracked"] == first["entropy_exact"] != first["entropy"]
    expected = (sum(exact) + first["entropy_exact"]) / 3
    assert first["entropy_target"] == pytest.approx(expected, abs=1e-3)


PROBE_STATES = [a if a != "sampled" else "probe" for a in RUN]


def test_the_probe_estimator_rescores_the_same_states_so_a_fixed_policy_reads_one_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``estimator probe`` tracks the policy on the target probe's batches, rescored before
    every update: with the policy all but fixed (lr 1e-12) every iteration reads the same
    value, while the batches' own exact entropy moves with the prompts drawn."""
    args = [*PROBE_STATES, "--iterations", "3", "--lr", "1e-12"]
    assert cli([*args, "--algo.controller.target-probe", "2", "--out", str(tmp_path / "r")]) == 0
    probe = _probe_values(capsys.readouterr().out)
    rows = _train_rows(tmp_path / "r")
    tracked = [r["entropy_tracked"] for r in rows]
    assert tracked[0] == pytest.approx(sum(probe) / 2, abs=1e-3)  # the probe's states, printed
    assert max(tracked) - min(tracked) < 1e-6
    assert all(r["entropy_target"] == pytest.approx(tracked[0], rel=1e-9) for r in rows)
    # the bonus lever scores the batches' exact entropy anyway: the random model's is near
    # uniform, so it moves little, but it moves with the prompts drawn
    batch_exact = [r["entropy_exact"] for r in rows]
    assert max(batch_exact) - min(batch_exact) > 10 * (max(tracked) - min(tracked)) + 1e-5


def test_a_resumed_run_tracks_the_probe_states_of_its_start(tmp_path: Path) -> None:
    args = [*PROBE_STATES, "--algo.controller.target-probe", "2", "--checkpoint-every", "1"]
    assert cli([*args, "--iterations", "3", "--out", str(tmp_path / "full")]) == 0
    assert cli([*args, "--iterations", "2", "--out", str(tmp_path / "cut")]) == 0
    assert (
        cli([*args, "--iterations", "3", "--resume", "true", "--out", str(tmp_path / "cut")]) == 0
    )
    full, cut = _train_rows(tmp_path / "full"), _train_rows(tmp_path / "cut")
    assert [r["iteration"] for r in cut] == [0, 1, 2]
    for a, b in zip(full, cut, strict=True):
        assert b["entropy_tracked"] == pytest.approx(a["entropy_tracked"], rel=1e-6, abs=1e-9)
    assert full[2]["entropy_tracked"] != full[0]["entropy_tracked"]  # the policy did move


def test_the_probe_estimator_without_probe_batches_is_one_line_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert cli([*PROBE_STATES, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("set algo.controller.target_probe 1 or more"), err
    assert not out.exists()


def test_a_run_resumed_before_its_target_is_known_keeps_the_probe_of_its_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The target averages the probe and the first 3 iterations; a run cut after 1 resumes
    with the probe its checkpoint holds (the probe is sampled once, from the initial policy,
    not again from the resumed one) and reaches the uninterrupted run's target."""
    args = [*RUN, "--algo.controller.target-probe", "2", "--algo.controller.target-iterations",
            "3", "--checkpoint-every", "1"]  # fmt: skip
    assert cli([*args, "--iterations", "3", "--out", str(tmp_path / "full")]) == 0
    assert cli([*args, "--iterations", "1", "--out", str(tmp_path / "cut")]) == 0
    capsys.readouterr()
    resume = [*args, "--iterations", "3", "--resume", "true", "--out", str(tmp_path / "cut")]
    assert cli(resume) == 0
    assert "target probe" not in capsys.readouterr().out  # nothing sampled again
    full, cut = _train_rows(tmp_path / "full"), _train_rows(tmp_path / "cut")
    assert full[2]["entropy_target"] is not None
    assert cut[2]["entropy_target"] == pytest.approx(full[2]["entropy_target"], rel=1e-9)
