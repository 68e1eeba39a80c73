"""``check_text_env``: every built-in env passes; each broken promise is named, with its task."""

from __future__ import annotations

import re
import warnings
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

import entrogym  # noqa: F401  (registers the built-in ids)
from entrogym.envs import (
    BUILTIN_ENV_IDS,
    EnvContractError,
    TextEnv,
    TextEnvCheckError,
    TextEnvProtocol,
    Turn,
    UnicodeText,
    check_text_env,
    make_text_env,
)

# The envs that need an argument (tests/envs/test_reasoning_gym_env.py and
# test_textarena_env.py check many more of their datasets and games).
BUILTIN_KWARGS = {
    "entrogym/ReasoningGym-v0": {"dataset": "leg_counting", "size": 4, "test_size": 2},
    "entrogym/TextArena-v0": {"game": "TowerOfHanoi-v0", "num_train": 3, "num_test": 2},
}


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
def test_builtin_envs_pass(env_id: str) -> None:
    if env_id == "entrogym/AppWorld-v0":
        pytest.skip("needs .venv-appworld and a world; checked in tests/envs/test_appworld.py")
    # gymnasium.make: wrapped in Gymnasium's own wrappers
    env = make_text_env(env_id, **BUILTIN_KWARGS.get(env_id, {}))
    try:
        assert isinstance(env.unwrapped, TextEnvProtocol)
        check_text_env(env)
        check_text_env(env.unwrapped, split=env.unwrapped.splits[-1], max_tasks=1, seed=3)
    finally:
        env.close()


def test_wrapped_env_passes() -> None:
    env = RecordEpisodeStatistics(TimeLimit(make_text_env("entrogym/Arithmetic-v0"), 5))
    check_text_env(env, max_tasks=1)


class Plain(gym.Env):
    """A text env written against Gymnasium alone; each ``fault`` breaks one promise."""

    reward_range = (0.0, 1.0)

    def __init__(self, fault: str = "") -> None:
        self.fault, self.calls, self.done, self.turn, self.flagged = fault, 0, False, 0, False
        self.observation_space = UnicodeText(1000)
        self.action_space = UnicodeText(1000, min_length=1)

    def task_ids(self, split: str | None = None) -> list[str]:
        self.calls += 1
        ids = ["a", "b", "c"]
        return ids[::-1] if self.fault == "ids" and self.calls > 1 else ids

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.done, self.turn, self.flagged = False, 0, False
        task = (options or {})["task_id"]
        prompt = f"task {task}" + (f" {seed}" if self.fault == "prompt" and task == "b" else "")
        return prompt, {}

    def step(self, action: str):
        if self.done and self.fault != "no-end":
            raise RuntimeError("episode over")
        self.turn += 1
        info: dict[str, Any] = {"action_truncated": True} if self.flagged else {}
        self.flagged = False
        if self.turn < 2:
            return "more", (0.5 if self.fault == "early-reward" else 0.0), False, False, info
        self.done = True
        reward = 1e6 if self.fault == "range" else 1.0
        if self.fault != "no-success":
            info["success"] = "yes" if self.fault == "success-string" else True
        return "done", reward, True, False, info

    def end_episode(self) -> tuple[float, dict]:
        if self.done and self.fault != "no-end":
            raise RuntimeError("episode over")
        self.done = self.fault != "no-end"
        return 0.0, {"success": False}

    def flag_action_truncated(self) -> None:
        self.flagged = self.fault != "no-flag"


def test_plain_gymnasium_env_passes() -> None:
    check_text_env(Plain(), max_tasks=3)


@pytest.mark.parametrize(
    ("fault", "check", "task_id", "detail"),
    [
        ("ids", "check_task_ids_stable", None, "changed between two calls"),
        ("prompt", "check_prompt_is_stable", "b", "different prompts"),
        (
            "early-reward",
            "check_episode_rewards",
            "a",
            "step 1: reward 0.5 before the episode's last",
        ),
        ("range", "check_episode_rewards", "a", "outside the env's reward_range"),
        ("no-success", "check_episode_rewards", "a", "info['success'] must be a bool"),
        ("success-string", "check_episode_rewards", "a", "info['success'] is a str ('yes')"),
        ("no-end", "check_end_episode", "a", "step after end_episode() did not raise"),
        ("no-flag", "check_action_truncation", "a", "action_truncated"),
    ],
)
def test_each_failure_names_its_check_and_task(
    fault: str, check: str, task_id: str | None, detail: str
) -> None:
    with pytest.raises(TextEnvCheckError, match=re.escape(detail)) as caught:
        check_text_env(Plain(fault), max_tasks=3)
    assert caught.value.check == check and caught.value.task_id == task_id
    where = f" on task {task_id!r}" if task_id else ""
    assert str(caught.value).startswith(f"{check} failed{where}: ")


def test_env_exception_is_reported_with_check_and_task() -> None:
    class Crashes(Plain):
        def step(self, action: str):
            raise KeyError("no such table")

    with pytest.raises(TextEnvCheckError, match="step 1 raised KeyError") as caught:
        check_text_env(Crashes())
    assert caught.value.check == "check_episode_rewards" and caught.value.task_id == "a"


def test_missing_methods_and_bad_arguments() -> None:
    class NoEnd(Plain):
        end_episode = None  # type: ignore[assignment]

    with pytest.raises(TextEnvCheckError, match="check_end_episode failed"):
        check_text_env(NoEnd())
    with pytest.raises(ValueError, match="max_tasks"):
        check_text_env(Plain(), max_tasks=0)


class Counter(TextEnv):
    """Two turns; the terminal reward is ``value``."""

    splits = ("train",)

    def __init__(self, value: float = 1.0, **kwargs: Any) -> None:
        super().__init__(max_turns=2, **kwargs)
        self.value = value

    def task_ids(self, split: str | None = None) -> list[str]:
        return ["t0"]

    def _start_task(self, task_id: str) -> tuple[str, dict]:
        return "count", {}

    def _respond(self, action: str) -> Turn:
        done = self._turn == 1
        return Turn("ok", done=done, reward=self.value, success=done)


def test_textenv_checks_its_reward_against_reward_range() -> None:
    env = Counter(value=2.0)
    env.reset(options={"task_id": "t0"})
    env.step("x")
    with pytest.raises(EnvContractError, match=r"task 't0': reward 2 is outside .*\(0, 1\)"):
        env.step("x")
    assert env.turn == 1  # the episode is as it was
    wide = Counter(value=2.0, reward_range=(-5, 5))
    check_text_env(wide)
    for bad in ((1, 0), (0, float("nan")), "ab", (1,), None.__class__):
        with pytest.raises(ValueError, match="reward_range"):
            Counter(reward_range=bad)  # type: ignore[arg-type]
    nan = Counter(value=float("nan"))
    with pytest.raises(TextEnvCheckError, match="not finite"):
        check_text_env(nan)


def test_old_hook_name_still_works_with_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        class Old(Counter):
            def _begin(self, task_id: str) -> tuple[str, dict]:
                return "old prompt", {}

    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert Old().reset(options={"task_id": "t0"})[0] == "old prompt"
