"""``entrogym/World-v0``: registration, the contract, tools and demonstrations in the reset
info, episodes ended by the agent or by ``max_turns`` (graded as left), bad arguments, and the
evaluation hooks' TGC/SGC."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import entrogym  # noqa: F401  (registers the built-in ids)
from entrogym.envs import check_text_env, make_text_env
from entrogym.envs.tools import AgentMessage, ToolCall, demonstration_problem
from entrogym.envs.world.env import WorldEnv
from entrogym.envs.world.tasks import TRAIN_TEMPLATES

SMALL = {"train_scenarios": 2, "test_scenarios": 1}


def act(*calls: ToolCall, content: str = "") -> str:
    return AgentMessage(content, list(calls)).to_action()


def test_registered_and_passes_the_checker() -> None:
    env = make_text_env("entrogym/World-v0", **SMALL)
    try:
        inner = env.unwrapped
        assert isinstance(inner, WorldEnv) and inner.splits == (
            "train", "test_normal", "test_challenge")  # fmt: skip
        assert len(inner.task_ids("train")) == 2 * len(TRAIN_TEMPLATES) * 3
        assert len(inner.task_ids("test_challenge")) == 1 * 3 * 3
        check_text_env(env)
        check_text_env(inner, split="test_challenge", max_tasks=1, seed=3)
    finally:
        env.close()


def test_reset_info_and_a_completed_episode() -> None:
    env = WorldEnv(split="test_normal", **SMALL)
    task_id = next(t for t in env.task_ids() if env.task(t).template == "msg")
    task = env.task(task_id)
    observation, info = env.reset(options={"task_id": task_id})
    assert observation == task.instruction
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == ["find_contact", "send_message", "add_event", "buy", "block_contact"]
    assert demonstration_problem(info["demonstration"], set(names)) is None
    (goal,) = task.goals
    obs, reward, done, truncated, info = env.step(
        act(ToolCall("find_contact", {"name": goal.name}))
    )
    assert goal.phone in obs and not done and reward == 0.0
    obs, reward, done, _, info = env.step(
        act(ToolCall("send_message", {"phone": goal.phone, "text": goal.text}))
    )
    assert obs == "sent" and not done and info["tool_errors"] == 0
    _, reward, done, truncated, info = env.step(act(content="done"))
    assert done and not truncated and reward == 1.0 and info["success"] is True
    assert info["end_reason"] == "done" and info["scenario_id"] == task.scenario_id
    assert set(info["reward_parts"].values()) == {1.0}
    # a new episode starts from the task's own world again
    env.reset(options={"task_id": task_id})
    _, reward, *_ = env.step(act(content="done"))
    assert reward == pytest.approx(1 / 3)


def test_max_turns_grades_the_world_as_left_and_errors_are_observations() -> None:
    env = WorldEnv(split="train", max_turns=2, **SMALL)
    task_id = next(t for t in env.task_ids() if env.task(t).template == "event")
    (goal,) = env.task(task_id).goals
    env.reset(options={"task_id": task_id})
    obs, _, done, _, info = env.step(act(ToolCall("add_event", {"title": goal.title, "day": 3})))
    assert "day" in obs and info["tool_errors"] == 1 and not done
    obs, reward, done, truncated, info = env.step(
        act(ToolCall("add_event", {"title": goal.title, "day": "Someday"}))
    )
    assert "not a day of the week" in obs and info["tool_errors"] == 1
    assert truncated and not done and info["end_reason"] == "max_turns"
    assert reward == pytest.approx(1 / 3) and info["success"] is False
    env.reset(options={"task_id": task_id})
    env.step(act(ToolCall("add_event", {"title": goal.title, "day": goal.day})))
    _, reward, _, truncated, info = env.step(act(ToolCall("find_contact", {"name": "Nobody"})))
    assert truncated and reward == 1.0 and info["success"] is True


def test_evaluation_report_gives_tgc_and_sgc() -> None:
    env = WorldEnv(split="test_normal", **SMALL)
    tasks = env.task_ids()[:6]  # two scenarios of three tasks
    assert len({env.task(t).scenario_id for t in tasks}) == 2
    passed = set(tasks[:3]) | {tasks[3]}  # the first scenario complete, the second not
    episodes = [SimpleNamespace(task_id=t, info={"success": t in passed}) for t in tasks]
    report = env.evaluation_report({"episodes": episodes, "tasks": tasks, "samples": 1}, None)
    assert report["tgc"] == pytest.approx(4 / 6) and report["sgc"] == pytest.approx(1 / 2)
    assert report["summary_text"] == "TGC=66.7% SGC=50.0%"
    fields = env.evaluation_task_fields(tasks[0], [])
    assert fields == {"scenario_id": env.task(tasks[0]).scenario_id, "template": "msg"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"demonstrations": ["nope"]}, "demonstrations must be a list of names"),
        ({"demonstrations": "event"}, "demonstrations must be a list of names"),
        ({"test_scenarios": 0}, "test_scenarios must be an integer >= 1"),
        ({"split": "dev"}, "unknown split 'dev'"),
    ],
)
def test_bad_arguments_are_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorldEnv(**kwargs)
