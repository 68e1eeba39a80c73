"""Test envs for the trainer: importable by torchrun children as ``vowel_env:test/Vowel-v0``."""

from __future__ import annotations

import json

import gymnasium as gym

from entrogym.algos import get_algorithm
from entrogym.envs.base import TextEnv, Turn


class VowelEnv(TextEnv):
    """Reward = share of vowels among the action's letters: graded, so groups differ."""

    splits = ("train",)

    def task_ids(self, split: str | None = None) -> list[str]:
        self.resolve_split(split)
        return [f"v{i}" for i in range(6)]

    def _start_task(self, task_id: str):
        return f"Say something with many vowels ({task_id}).", {}

    def _respond(self, action: str) -> Turn:
        letters = [c for c in action.lower() if c.isalpha()]
        reward = sum(c in "aeiou" for c in letters) / max(len(letters), 1)
        return Turn(done=True, reward=reward, success=reward > 0.5)


class VowelTurnsEnv(TextEnv):
    """Multi-turn: the episode goes on until an action's share of vowels among its letters is
    at least ``enough`` (done, reward = that share) or ``max_turns`` actions ran out (graded
    as left: the last action's share). Every action counts as a tool call and one with a
    capital letter as a failed call (each step's ``info["tool_calls"]`` and ``info["tool_errors"]``
    count its own, as a ``ToolEnv``'s do). ``pay_turns``: each action is
    paid share / max_turns when it comes (a per-turn reward) and the terminal reward is 0.
    ``log``: a file that gets one JSON line per ended episode, the env's own record of it."""

    splits = ("train", "test")

    def __init__(self, max_turns: int = 3, enough: float = 0.4, pay_turns: bool = False,
                 log: str | None = None, split: str | None = None) -> None:  # fmt: skip
        super().__init__(split=split, max_turns=max_turns)
        self.enough, self.pay_turns, self.log = enough, pay_turns, log
        self._last = self._paid = 0.0
        self._calls = self._errors = 0

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        return [f"{name}-{i}" for i in range(6 if name == "train" else 3)]

    def _start_task(self, task_id: str):
        self._last = self._paid = 0.0
        self._calls = self._errors = 0
        return f"Say something with many vowels ({task_id}); I will answer.", {}

    def _respond(self, action: str) -> Turn:
        letters = [c for c in action.lower() if c.isalpha()]
        share = sum(c in "aeiou" for c in letters) / max(len(letters), 1)
        failed = any(c.isupper() for c in action)
        self._last, self._calls, self._errors = share, self._calls + 1, self._errors + failed
        done = share >= self.enough
        paid = share / self.max_turns if self.pay_turns else 0.0
        info = {"tool_calls": 1, "tool_errors": int(failed)}
        return Turn(f"{share:.2f} of your letters were vowels.", done=done,
                    reward=0.0 if self.pay_turns else share, success=done, info=info,
                    turn_reward=paid)  # fmt: skip

    def _on_truncate(self) -> Turn:
        return Turn(done=True, reward=0.0 if self.pay_turns else self._last, success=False)

    def step(self, action: str):
        observation, reward, terminated, truncated, info = super().step(action)
        self._paid += reward
        if self.log and (terminated or truncated):
            record = {"task_id": self.task_id, "turns": self.turn, "return": self._paid,
                      "end": "done" if terminated else "max_turns", "tool_calls": self._calls,
                      "tool_errors": self._errors}  # fmt: skip
            with open(self.log, "a") as fh:  # one write per line: workers append side by side
                fh.write(json.dumps(record) + "\n")
        return observation, reward, terminated, truncated, info


if "test/Vowel-v0" not in gym.registry:
    gym.register("test/Vowel-v0", entry_point=VowelEnv)
if "test/VowelTurns-v0" not in gym.registry:
    gym.register("test/VowelTurns-v0", entry_point=VowelTurnsEnv)
if "test/Const-v0" not in gym.registry:
    gym.register("test/Const-v0", entry_point="entrogym.envs.arithmetic:ArithmeticEnv")


# The smallest real training run (tiny random Llama, hf engine, fp32) the trainer tests share;
# a test overrides what it is about: ``TrainConfig(out=..., **{**TINY_RUN, "samples": 3})``.
TINY_RUN = dict(
    env="test/Vowel-v0",
    algo=get_algorithm("repo-r"),
    model="tiny-random-llama",
    engine="hf",
    engine_dtype="fp32",
    tasks_per_iter=2,
    samples=2,
    early_stop_min_per_task=2,
    early_stop_fraction=1.0,
    max_response_tokens=4,
    on_turn_budget="step",
    max_context_tokens=256,
)
# The same without env and algo, for tests that name their own.
TINY_SETTINGS = {k: v for k, v in TINY_RUN.items() if k not in ("env", "algo")}
# A run whose resumed metrics must equal an uninterrupted one's (kill -9, SIGTERM): groups
# of 3, a learning rate that moves the policy visibly within a few iterations.
RESUMABLE_RUN = {
    **TINY_RUN,
    "samples": 3,
    "early_stop_min_per_task": 3,
    "micro_batch_size": 4,
    "lr": 1e-2,
    "max_grad_norm": 1.0,
}


def option_words(settings: dict) -> list[str]:
    """``settings`` as ``entrogym train`` options (``--tasks-per-iter 2 ...``): what a test
    that starts the command in a subprocess passes. An algorithm is one of the presets
    unchanged, written as its name."""
    from entrogym.algos import AlgorithmConfig

    words: list[str] = []
    for key, value in settings.items():
        if isinstance(value, AlgorithmConfig):
            assert value == get_algorithm(value.name), "only an unchanged preset has a name"
            value = value.name
        words += [f"--{key.replace('_', '-')}", str(value)]
    return words
