"""Multi-turn traps: a ``max_turns`` declared on an env class (the README's Echo style) is
honoured, not overwritten by the base class's default of 1; the env checker flags an env whose
turns cannot exceed 1 though its class declares more; a turn cut by the token budget is counted
in the metrics, and under the default rule (``--on-turn-budget truncate``) the cut that ends a
multi-turn episode is announced once per run instead of ending every episode without a word."""

from __future__ import annotations

import gymnasium as gym
import pytest
from vowel_env import TINY_RUN

from entrogym.envs.base import TextEnv, Turn
from entrogym.envs.checker import TextEnvCheckError, check_text_env
from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.trainer import train


class TalkEnv(TextEnv):
    """Three turns, declared as the README declares an env's settings: a class attribute."""

    splits = ("train", "test")
    max_turns = 3

    def task_ids(self, split=None):
        return [f"{self.resolve_split(split)}-{i}" for i in range(4)]

    def _start_task(self, task_id):
        return f"Talk to me ({task_id}).", {}

    def _respond(self, action):
        done = self.turn + 1 >= 3
        return Turn(observation="Go on.", done=done, reward=float(done), success=done)


class OneTurnTalkEnv(TalkEnv):
    """Declares 3 turns on its class, but its constructor asks the base for 1."""

    def __init__(self, **kwargs):
        super().__init__(max_turns=1, **kwargs)


if "test/Talk-v0" not in gym.registry:
    gym.register("test/Talk-v0", entry_point=TalkEnv)


def test_a_class_attribute_max_turns_is_honoured() -> None:
    env = TalkEnv()
    assert env.max_turns == 3
    env.reset(options={"task_id": "train-0"})
    ended = [env.step("hello")[2:4] for _ in range(3)]
    assert ended == [(False, False), (False, False), (True, False)]
    assert TalkEnv(max_turns=2).max_turns == 2  # the constructor's argument still wins


def test_the_checker_flags_an_env_whose_turns_cannot_exceed_what_it_declares() -> None:
    check_text_env(TalkEnv())
    with pytest.raises(TextEnvCheckError, match="max_turns = 3") as info:
        check_text_env(OneTurnTalkEnv())
    assert info.value.check == "check_turn_limit"
    assert "\n" not in str(info.value)


def test_cut_turns_are_counted_and_the_cut_is_announced_once(tmp_path, capsys) -> None:
    """Each turn may sample 2 tokens (the tiny model never stops that soon): every turn is
    cut, and under the default rule the cut ends the episode at its first turn."""
    settings = {**TINY_RUN, "on_turn_budget": "truncate", "max_response_tokens": 2}
    cfg = TrainConfig(out=str(tmp_path / "run"), env="test/Talk-v0", iterations=2,
                      env_workers=0, **{k: v for k, v in settings.items() if k != "env"})  # fmt: skip
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "run") if r.get("kind", "train") == "train"]
    assert len(rows) == 2
    for row in rows:
        assert row["turns_cut"] == row["episodes"]  # one cut turn ended each episode
        assert row["end_reasons"]["turn_budget"] == row["episodes"]
        assert row["turns_mean"] == 1.0
    said = capsys.readouterr()
    notices = [line for line in (said.out + said.err).splitlines() if "--on-turn-budget" in line]
    assert len(notices) == 1, notices
    assert "max_turns 3" in notices[0] and "--on-turn-budget step" in notices[0]


class SteppingTalkEnv(TalkEnv):
    """Declares its turn-budget rule, as AppWorld and the world do: a cut turn goes to the env."""

    on_turn_budget = "step"


if "test/SteppingTalk-v0" not in gym.registry:
    gym.register("test/SteppingTalk-v0", entry_point=SteppingTalkEnv)


def test_training_takes_the_env_s_declared_turn_budget_rule(tmp_path, capsys) -> None:
    """No --on-turn-budget given: training follows the env's declared ``step``, as eval does,
    so every cut turn reaches the env and each episode runs its three turns."""
    settings = {k: v for k, v in TINY_RUN.items() if k not in ("env", "on_turn_budget")}
    cfg = TrainConfig(out=str(tmp_path / "run"), env="test/SteppingTalk-v0", iterations=1,
                      env_workers=0, **{**settings, "max_response_tokens": 2})  # fmt: skip
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "run") if r.get("kind", "train") == "train"]
    assert rows[0]["end_reasons"]["turn_budget"] == 0
    assert rows[0]["turns_mean"] == 3.0
    said = capsys.readouterr()
    assert "--on-turn-budget" not in said.out + said.err
