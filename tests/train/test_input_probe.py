"""The input dependence in the trainer: the learner's cross-scoring of sampled responses under
every probe prompt against a direct forward of each (prompt, response) pair on a tiny LoRA
model, and ``entrogym train`` logging it, leaving the run's samples alone, and feeding a
controller that tracks it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from entrogym.algos import input_dependence
from entrogym.commands.train import cli
from entrogym.train.config import TrainConfig
from entrogym.train.devices.distributed import Ranks
from entrogym.train.input_probe import score_input_dependence
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock
from tests.lora_policy import randomise_lora_b
from tests.token_rows import episodes_batch


def _direct_score(model: torch.nn.Module, prompt: list[int], response: list[int]) -> float:
    """log pi(response | prompt): one forward of the pair alone, full fp64 log-softmax."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.double()
    logp = torch.log_softmax(logits[0], -1)
    return sum(float(logp[len(prompt) - 1 + i, tok]) for i, tok in enumerate(response))


def test_the_learners_cross_scores_are_direct_forwards_of_each_prompt_and_response():
    cfg = TrainConfig(model="tiny-random-llama", env="entrogym/Arithmetic-v0", dtype="fp32",
                      micro_batch_size=3)  # fmt: skip
    learner = Learner(cfg, Ranks(), PhaseClock())
    randomise_lora_b(learner.policy, seed=2)
    with torch.no_grad():  # a sharper head, so responses depend on the prompt measurably
        learner.policy.get_output_embeddings().weight.mul_(4.0)
    prompts = {0: [5, 17, 40, 9], 1: [61, 3, 88], 2: [120, 7, 7, 15, 30]}
    g = torch.Generator().manual_seed(0)
    rows, groups, responses = [], [], []
    for task, prompt in prompts.items():
        for length in (2, 4):
            response = torch.randint(3, 200, (length,), generator=g).tolist()
            rows.append((prompt + response, [0] * len(prompt) + [1] * length))
            groups.append(task)
            responses.append(response)
    # a second turn after an env reply: not part of the first response
    prompt, first = prompts[1], [44, 45, 46]
    rows.append((prompt + first + [90, 91] + [12], [0] * 3 + [1] * 3 + [0, 0] + [1]))
    groups.append(1)
    responses.append(first)
    metrics = score_input_dependence(learner, episodes_batch(rows, groups))
    direct = torch.tensor(
        [[_direct_score(learner.policy, prompts[j], r) for r in responses] for j in range(3)]
    )
    expected = input_dependence(direct, torch.tensor(groups))
    assert metrics["input_dependence"] == pytest.approx(expected, abs=1e-4)
    assert abs(metrics["input_dependence"]) > 1e-3  # the prompts do move the scores
    assert 0 <= metrics["input_retrieval"] <= 1


RUN = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 16, num_test: 4}",
    "--iterations", "3", "--tasks-per-iter", "2", "--samples", "3",
    "--early-stop-min-per-task", "3", "--max-response-tokens", "6", "--lr", "0.05",
]  # fmt: skip


def _train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def test_train_logs_it_every_n_iterations_and_samples_what_it_would_without(tmp_path: Path):
    assert cli([*RUN, "--out", str(tmp_path / "plain")]) == 0
    probe = ["--input-dependence-every", "2", "--input-dependence-tasks", "3"]
    assert cli([*RUN, *probe, "--out", str(tmp_path / "probe")]) == 0
    plain, probed = _train_rows(tmp_path / "plain"), _train_rows(tmp_path / "probe")
    assert [("input_dependence" in r) for r in probed] == [True, False, True]
    for row in (probed[0], probed[2]):
        assert row["input_tasks"] == 3
        assert row["input_dependence"] <= math.log(3)
        assert row["input_dependence_per_token"] <= math.log(3)
        assert 0 <= row["input_retrieval"] <= 1
        assert row["input_dependence_s"] > 0
    assert probed[0]["input_dependence"] != probed[2]["input_dependence"]
    # its samples are trained on by nobody and drawn in their own stream: the run is unchanged
    for key in ("entropy", "generated_tokens", "reward_mean"):
        assert [r[key] for r in probed] == [r[key] for r in plain]


def test_a_controller_tracks_it_measured_before_every_update(tmp_path: Path):
    # a target in nats: a tiny random model's responses hardly depend on the task, and an
    # estimate near 0 may be negative, of which no ratio is a target
    tracked = ["--algo", "repo-r", "--algo.controller.estimator", "input_dependence",
               "--algo.controller.target-unit", "nats", "--algo.controller.target", "0.5"]  # fmt: skip
    assert cli([*RUN, *tracked, "--iterations", "2", "--out", str(tmp_path)]) == 0
    rows = _train_rows(tmp_path)
    assert all(r["entropy_tracked"] == r["input_dependence"] for r in rows)  # every iteration
    assert all(r["entropy_target"] == 0.5 for r in rows)
    assert all(r["entropy_error"] == pytest.approx(r["input_dependence"] / 0.5 - 1) for r in rows)
    assert all(r["input_tasks"] == 4 for r in rows)  # the default probe size


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input-dependence-every", "-1"], "input_dependence_every must be >= 0"),
        (["--input-dependence-every", "1", "--input-dependence-tasks", "1"], "must be >= 2"),
        (["--input-dependence-every", "1", "--input-dependence-tasks", "17"],
         "input_dependence_tasks (17) is above the 16 tasks"),
    ],
)  # fmt: skip
def test_a_bad_probe_size_is_one_line_before_any_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "bad"
    assert cli([*RUN, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1], err
    assert not out.exists()
