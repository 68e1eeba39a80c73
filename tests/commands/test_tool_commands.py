"""The tools seam through the commands a user types: a class written for TRL's
``environment_factory`` trained and evaluated with ``--env module:Class``, the turn options in
``--help``, and bad input (one line, exit 2, before any model loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from entrogym.commands import eval as eval_command
from entrogym.commands import train as train_command

REPO = Path(__file__).resolve().parents[2]
TESTS = str(REPO / "tests")
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]
QUICK = [*TINY, "--iterations", "2", "--tasks-per-iter", "2", "--samples", "2",
         "--early-stop-min-per-task", "2", "--max-turn-tokens", "6"]  # fmt: skip
TURN_OPTIONS = ("--max-turns", "--max-turn-tokens", "--feedback-role", "--tool-format")


def test_a_trl_style_env_trains_and_evaluates_unchanged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(TESTS)  # the env workers get this path too
    out = tmp_path / "run"
    env = ["--env", "trl_increment:IncrementEnv", "--env-kwargs", "{num_tasks: 4}"]
    argv = [*QUICK, *env, "--max-turns", "2", "--eval-env", "trl_increment:IncrementEnv",
            "--eval-env-kwargs", "{num_tasks: 2}", "--eval-every", "1"]  # fmt: skip
    assert train_command.cli([*argv, "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert len(train) == 2 and evals and all(r["split"] == "test" for r in evals)
    assert all(r["env_errors"] == 0 for r in train)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["max_turns"] == 2 and saved["max_response_tokens"] == 6
    # and the command that evaluates it, with the env's own turn limit lowered by --max-turns
    ev = tmp_path / "ev"
    argv = [*TINY, *env, "--max-tasks", "2", "--samples", "2", "--max-turn-tokens", "6"]
    assert eval_command.cli([*argv, "--max-turns", "1", "--out", str(ev)]) == 0
    report = json.loads((ev / "eval.json").read_text())
    assert report["summary"]["episodes"] == 4 and report["summary"]["env_errors"] == 0
    assert report["summary"]["split"] == "test"
    assert all(n == 1 for t in report["per_task"] for n in t["num_turns"])


@pytest.mark.parametrize("command", [train_command, eval_command])
def test_turn_options_are_in_help(command, capsys) -> None:
    text = command.build_parser().format_help()
    for option in TURN_OPTIONS:
        assert option in text


BAD = [
    (["--max-turns", "0"], "max_turns (--max-turns) must be >= 1 (actions per episode), got 0"),
    (["--max-turn-tokens", "0"], "max_turn_tokens must be >= 1, got 0"),
    (["--env", "trl_increment:NotAnEnv"], "neither a text env"),
    (["--env", "trl_increment:NoRewardEnv"], "has no get_reward method"),
    (["--env", "trl_increment:UndocumentedToolEnv"], "UndocumentedToolEnv.peek is public"),
    (["--env", "tool_envs:BadToolEnv"], "tool 'lookup': Argument name is missing a type hint"),
    (["--tool-format", "template"], "tool_format 'template' needs a chat template that renders"),
    (["--feedback-role", "system"], "feedback_role"),
    (["--env", "tool_envs:ToolPhone-v0", "--env-kwargs", "{max_turns: 3}", "--max-turns", "2"],
     "env keyword 'max_turns' given twice"),
]  # fmt: skip


@pytest.mark.parametrize("command", [train_command, eval_command], ids=["train", "eval"])
@pytest.mark.parametrize(("extra", "words"), BAD, ids=[" ".join(b[0][:2]) for b in BAD])
def test_bad_input_is_one_line_exit_2_before_any_model_loads(
    command, extra: list[str], words: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.syspath_prepend(TESTS)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("entrogym.train.learner.policy.load_base_model", no_model)
    monkeypatch.setattr("entrogym.agents.engines.make_engine", no_model)
    out = tmp_path / "run"
    env = [] if "--env" in extra else ["--env", "trl_increment:IncrementEnv"]
    assert command.cli([*TINY, *env, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{command.PROG}: error: ") and words in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
