"""Env classes written for TRL's ``GRPOTrainer(environment_factory=...)`` as TRL's GRPO
documentation shows them ("Agent Training > Environments"): nothing entrogym-specific. The
tests train and evaluate them through ``entrogym train --env trl_increment:IncrementEnv``."""

from __future__ import annotations

import asyncio
import random


class IncrementEnv:
    # TRL's reserved methods: reset (required) and get_reward (optional)
    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)  # the env samples its own task
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    # every other public method is a tool
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class DatasetIncrementEnv(IncrementEnv):
    """The dataset variant: each row's ``target`` column reaches ``reset`` as a keyword (the
    row's ``prompt`` is the prompt); the tool and the reward are IncrementEnv's."""

    def reset(self, target, **kwargs) -> None:
        self.counter = 0
        self.target = target


class AsyncIncrementEnv(IncrementEnv):
    """TRL allows async tools and an async get_reward."""

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return float(self.counter == self.target)

    async def decrement(self, step: int) -> int:
        """
        Decrement the internal counter.

        Args:
            step: Value to subtract from the counter.
        """
        self.counter -= step
        return self.counter


class NoRewardEnv:
    def reset(self, **kwargs) -> str:
        return "Say hi."

    def hello(self) -> str:
        """Say hello."""
        return "hello"


class UndocumentedToolEnv(IncrementEnv):
    def peek(self, step: int) -> int:  # public, so a tool, but without a docstring
        return self.counter


class NotAnEnv:
    """Neither a text env nor a TRL-style env: no reset."""

    def run(self) -> None:
        """Run."""
