"""Test envs for the trainer: importable by torchrun children as ``vowel_env:test/Vowel-v0``."""

from __future__ import annotations

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


if "test/Vowel-v0" not in gym.registry:
    gym.register("test/Vowel-v0", entry_point=VowelEnv)
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
