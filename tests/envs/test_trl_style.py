"""Env classes written for TRL's ``environment_factory``, run as entrogym text envs with tools:
their tools and reward, their tasks (env-owned or from a dataset), and what ``--env
module:Class`` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trl_increment
from trl_increment import DatasetIncrementEnv, IncrementEnv

from entrogym.envs import check_text_env
from entrogym.envs.base import make_text_env
from entrogym.envs.resolve import env_takes_keyword, is_trl_style, resolve_env_id
from entrogym.envs.tools import AgentMessage, ToolCall, ToolDefinitionError
from entrogym.envs.trl_style import TRLStyleEnv


def act(env, *calls: ToolCall, content: str = ""):
    return env.step(AgentMessage(content, list(calls)).to_action())


def test_detection():
    assert is_trl_style(IncrementEnv) and is_trl_style(DatasetIncrementEnv)
    assert not is_trl_style(trl_increment.NotAnEnv)
    assert not is_trl_style(IncrementEnv())  # an instance is not a class
    assert not is_trl_style(TRLStyleEnv)  # a Gymnasium env


def test_env_owned_tasks_are_seeded_by_task_id():
    env = TRLStyleEnv(IncrementEnv, num_tasks=20)
    assert env.splits == ("train", "test") and env.task_ids()[:2] == ["train-0", "train-1"]
    assert len(env.task_ids("test")) == 20
    obs, info = env.reset(options={"task_id": "train-3"})
    assert obs.startswith("Increment the counter by ")
    assert [t["function"]["name"] for t in info["tools"]] == ["increment"]
    # the same task id gives the same target, whatever the seed; the targets differ by task
    assert env.reset(seed=7, options={"task_id": "train-3"})[0] == obs
    targets = {env.reset(options={"task_id": t})[0] for t in env.task_ids()}
    assert len(targets) > 1


def test_an_episode_tools_then_get_reward():
    env = TRLStyleEnv(IncrementEnv, num_tasks=5)
    obs, _ = env.reset(options={"task_id": "train-0"})
    target = int(obs.rstrip(".").split()[-1])
    obs, reward, done, _, info = act(env, ToolCall("increment", {"step": target - 1}))
    assert obs == str(target - 1) and not done
    obs, reward, done, _, info = act(env, ToolCall("increment", {"step": 1}))
    assert obs == str(target) and not done
    obs, reward, done, _, info = act(env, content=f"The counter is {target}.")
    assert done and reward == 1.0 and info["success"] and info["end_reason"] == "done"
    env.reset(options={"task_id": "train-0"})
    assert act(env, content="no")[1] == 0.0  # a message without a call ends it: get_reward


def test_dataset_rows_reach_reset_as_keywords(tmp_path: Path):
    rows = [{"prompt": [{"role": "user", "content": f"Increment the counter to {i}."}],
             "target": i} for i in (2, 5)]  # fmt: skip
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    for dataset in (rows, str(path)):
        env = TRLStyleEnv(DatasetIncrementEnv, dataset=dataset)
        assert env.splits == ("train",) and env.task_ids() == ["train-0", "train-1"]
        obs, _ = env.reset(options={"task_id": "train-1"})
        assert obs == "Increment the counter to 5."  # reset returned None: the prompt alone
        act(env, ToolCall("increment", {"step": 5}))
        assert act(env, content="done")[1] == 1.0
    with_test = TRLStyleEnv(DatasetIncrementEnv, dataset=rows, test_dataset=rows[:1])
    assert with_test.task_ids("test") == ["test-0"]


def test_async_tools_and_reward():
    env = TRLStyleEnv(trl_increment.AsyncIncrementEnv, num_tasks=3)
    obs, info = env.reset(options={"task_id": "train-0"})
    assert {t["function"]["name"] for t in info["tools"]} == {"decrement", "increment"}
    target = int(obs.rstrip(".").split()[-1])
    act(env, ToolCall("increment", {"step": target + 2}), ToolCall("decrement", {"step": 2}))
    assert act(env, content="done")[1] == 1.0


def test_max_turns_grades_by_get_reward():
    env = TRLStyleEnv(IncrementEnv, num_tasks=3, max_turns=1)
    obs, _ = env.reset(options={"task_id": "train-1"})
    target = int(obs.rstrip(".").split()[-1])
    _, reward, done, truncated, info = act(env, ToolCall("increment", {"step": target}))
    assert truncated and reward == 1.0 and info["end_reason"] == "max_turns"


def test_bad_classes_are_one_line():
    with pytest.raises(ValueError, match="get_reward") as caught:
        TRLStyleEnv(trl_increment.NoRewardEnv)
    assert "\n" not in str(caught.value)
    with pytest.raises(ToolDefinitionError, match="peek"):
        TRLStyleEnv(trl_increment.UndocumentedToolEnv)
    with pytest.raises(ValueError, match="non-empty list"):
        TRLStyleEnv(DatasetIncrementEnv, dataset=[])
    two = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    with pytest.raises(ValueError, match="one user message"):
        TRLStyleEnv(DatasetIncrementEnv, dataset=[{"prompt": two, "target": 1}])


def test_module_class_resolves_and_passes_the_env_checker():
    env = make_text_env("trl_increment:IncrementEnv", num_tasks=4)
    assert isinstance(env.unwrapped, TRLStyleEnv)
    check_text_env(env, max_tasks=2)
    assert resolve_env_id("trl_increment:IncrementEnv") == "trl_increment.IncrementEnv"
    assert env_takes_keyword("trl_increment:IncrementEnv", "max_turns")
    # a TextEnv class is registered as it is
    text_env = make_text_env("tool_envs:PhoneEnv")
    assert type(text_env.unwrapped).__name__ == "PhoneEnv"
    with pytest.raises(ValueError, match="neither a text env") as caught:
        resolve_env_id("trl_increment:NotAnEnv")
    assert "\n" not in str(caught.value)
    assert resolve_env_id("entrogym/Arithmetic-v0") == "entrogym/Arithmetic-v0"
