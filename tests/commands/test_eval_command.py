"""``entrogym eval``: held-out split by default, ``module:id`` envs, foreign adapters refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import entrogym  # noqa: F401
from entrogym.commands.eval import cli
from entrogym.envs.base import make_text_env
from entrogym.train.evaluation.evaluate import held_out_split
from entrogym.train.folder.adapter_check import verify_adapter

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]


def test_the_default_split_is_held_out_never_train() -> None:
    env = make_text_env("entrogym/Arithmetic-v0", num_train=4, num_test=4)
    try:
        assert held_out_split(env) == "test"
        env.unwrapped.eval_split = "train"  # an env may declare its own eval split
        assert held_out_split(env) == "train"
    finally:
        env.close()
    env = make_text_env("entrogym/AIMETrain-v0")  # only a train split: no silent default
    try:
        with pytest.raises(ValueError, match="declares no held-out split"):
            held_out_split(env)
    finally:
        env.close()


def test_eval_of_a_module_env_on_its_held_out_split(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    out = tmp_path / "ev"
    argv = ["--env", "custom_env:examples/Unscramble-v0", *TINY, "--max-tasks", "2"]
    assert cli([*argv, "--max-response-tokens", "4", "--out", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    summary = report["summary"]
    assert summary["split"] == "test" and summary["tasks"] == 2
    assert summary["accuracy"] == summary["pass@1"]
    assert all(t["task_id"].startswith("test-") for t in report["per_task"])


@pytest.fixture(scope="module")
def llama_adapter(tmp_path_factory) -> Path:
    from entrogym.train.learner.policy import load_policy, save_adapter

    folder = tmp_path_factory.mktemp("adapters") / "llama"
    return save_adapter(load_policy("tiny-random-llama", seed=0), folder)


def test_an_adapter_for_another_base_model_is_refused(llama_adapter: Path, capsys) -> None:
    argv = ["--env", "entrogym/Arithmetic-v0", "--model", "tiny-random-qwen3", "--engine", "hf"]
    assert cli([*argv, "--adapter", str(llama_adapter), "--max-tasks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained on base model" in err and "tiny-random-qwen3" in err
    assert verify_adapter(str(llama_adapter), "tiny-random-llama", option="adapter")
    with pytest.raises(ValueError, match="not a LoRA adapter folder"):
        verify_adapter(str(llama_adapter.parent), "tiny-random-llama", option="adapter")
