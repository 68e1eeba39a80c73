"""``entrogym train`` on the envs from other packages, as a user types it (tiny random model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vowel_env import TINY_SETTINGS

from entrogym.commands.train import cli
from entrogym.train.folder.metrics import read_metrics

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
        "--iterations", "2", "--tasks-per-iter", "2", "--samples", "2",
        "--early-stop-min-per-task", "2", "--threads", "1"]  # fmt: skip
assert TINY_SETTINGS["model"] == "tiny-random-llama"


def test_reasoning_gym_trains_and_evaluates(tmp_path: Path) -> None:
    kwargs = json.dumps({"dataset": "leg_counting", "size": 50, "test_size": 4})
    argv = ["--env", "entrogym/ReasoningGym-v0", "--env-kwargs", kwargs, *TINY,
            "--max-response-tokens", "8", "--max-context-tokens", "512",
            "--eval-env", "entrogym/ReasoningGym-v0", "--eval-env-kwargs", kwargs,
            "--eval-every", "1", "--eval-tasks", "2", "--out", str(tmp_path)]  # fmt: skip
    assert cli(argv) == 0
    rows = read_metrics(tmp_path)
    train = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["iteration"] for r in train] == [0, 1] and all(r["episodes"] == 4 for r in train)
    assert [r["split"] for r in evals] == ["test", "test"] and evals[0]["tasks"] == 2


def test_a_textarena_game_trains_over_several_turns(tmp_path: Path) -> None:
    argv = ["--env", "entrogym/TextArena-v0", "--env-kwargs", '{"game": "TowerOfHanoi-v0"}',
            *TINY, "--max-response-tokens", "8", "--max-context-tokens", "1024",
            "--on-turn-budget", "step", "--out", str(tmp_path)]  # fmt: skip
    assert cli(argv) == 0
    rows = read_metrics(tmp_path)
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["env_errors"] == 0 for r in rows)
    # a random model's moves are invalid: TextArena warns once, then ends the game (2 turns)
    assert all(r["response_tokens_mean"] > 8 for r in rows)


@pytest.mark.parametrize(
    ("env_kwargs", "message"),
    [
        ('{"dataset": "leg_countin"}', "unknown reasoning-gym dataset"),
        ('{"game": "Chess-v0"}', "single-player games only"),
    ],
)
def test_bad_env_arguments_exit_2_with_one_line(
    env_kwargs: str, message: str, tmp_path: Path, capsys
) -> None:
    env = "entrogym/ReasoningGym-v0" if "dataset" in env_kwargs else "entrogym/TextArena-v0"
    argv = ["--env", env, "--env-kwargs", env_kwargs, *TINY, "--out", str(tmp_path / "run")]
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("entrogym train: error:")
    assert not (tmp_path / "run").exists()  # refused before the run folder was made
