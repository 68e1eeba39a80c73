"""``entrogym/Bandit-v0``: a K-armed (optionally contextual) bandit as a single-turn text env.

Each state ("task") is one context with its own arm means in [0, 1]. The observation names the
state and the arms; the action is the arm's number as text; the episode ends after that one
action with a reward in [0, 1] (Bernoulli with the arm's mean, or the mean itself).

The bandit lab (``entrogym bandit``) drives the same env without text: it draws a whole batch
of arms from a tabular softmax policy and scores them with :meth:`BanditEnv.sample_rewards`,
the one function that turns arms into rewards for both paths.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from entrogym.envs.base import TextEnv, Turn

REWARD_NOISES = ("bernoulli", "none")
SPLITS = ("train",)
_ARM = re.compile(r"-?\d+")


def make_reward_means(
    n_states: int, n_arms: int, seed: int = 0, correct_share: float = 0.25
) -> np.ndarray:
    """Arm means [n_states, n_arms], reproducible from ``seed``: like answers to a task, each arm
    is "correct" with probability ``correct_share`` (mean uniform in [0.8, 1]) or "wrong" (mean
    uniform in [0, 0.2]); every state has at least one correct arm."""
    if not 0 < correct_share <= 1:
        raise ValueError(f"correct_share must be in (0, 1], got {correct_share}")
    rng = np.random.default_rng(seed)
    correct = rng.random((n_states, n_arms)) < correct_share
    correct[np.arange(n_states), rng.integers(n_arms, size=n_states)] = True
    good = rng.uniform(0.8, 1.0, correct.shape)
    bad = rng.uniform(0.0, 0.2, correct.shape)
    return np.where(correct, good, bad)


class BanditEnv(TextEnv):
    """K-armed contextual bandit with rewards in [0, 1].

    Args:
        n_arms: arms per state (K >= 2).
        n_states: contexts (1 = a plain multi-armed bandit); task ids are ``state-0`` ...
        reward_means: optional explicit [n_states, n_arms] table in [0, 1]; otherwise drawn by
            :func:`make_reward_means` from ``means_seed``.
        reward_noise: ``"bernoulli"`` (reward 1 with the arm's mean probability, else 0) or
            ``"none"`` (the reward is the mean).
        means_seed: seed of the generated table.
        correct_share: share of "correct" arms in the generated table.

    ``info["success"]`` is whether the chosen arm is a best arm of its state; an action that
    names no valid arm gets reward 0 and ``info["invalid_action"] = True``.
    """

    def __init__(
        self,
        n_arms: int = 16,
        n_states: int = 8,
        reward_means: np.ndarray | list | None = None,
        reward_noise: str = "bernoulli",
        means_seed: int = 0,
        correct_share: float = 0.25,
        split: str | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            split=split,
            max_turns=1,
            max_observation_chars=4096,
            max_action_chars=4096,
            render_mode=render_mode,
        )
        if reward_noise not in REWARD_NOISES:
            raise ValueError(f"reward_noise must be one of {REWARD_NOISES}, got {reward_noise!r}")
        if reward_means is None:
            if not (isinstance(n_arms, int) and n_arms >= 2):
                raise ValueError(f"n_arms must be an integer >= 2, got {n_arms!r}")
            if not (isinstance(n_states, int) and n_states >= 1):
                raise ValueError(f"n_states must be an integer >= 1, got {n_states!r}")
            means = make_reward_means(n_states, n_arms, means_seed, correct_share)
        else:
            means = np.array(reward_means, dtype=np.float64)
            if means.ndim == 1:
                means = means[None, :]
            if means.ndim != 2 or means.shape[1] < 2:
                raise ValueError(
                    f"reward_means must be [n_states, n_arms] with n_arms >= 2, got {means.shape}"
                )
            if not np.all((means >= 0) & (means <= 1)):
                raise ValueError("reward_means must lie in [0, 1] (rewards are in [0, 1])")
        self.reward_means: np.ndarray = means
        self.reward_noise = reward_noise

    @property
    def n_states(self) -> int:
        return self.reward_means.shape[0]

    @property
    def n_arms(self) -> int:
        return self.reward_means.shape[1]

    @property
    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def task_ids(self, split: str | None = None) -> list[str]:
        self.resolve_split(split)
        return [f"state-{s}" for s in range(self.n_states)]

    def state_of(self, task_id: str) -> int:
        """State index of a task id ``state-<s>``."""
        prefix, _, number = task_id.partition("-")
        if prefix != "state" or not number.isdigit() or int(number) >= self.n_states:
            raise ValueError(
                f"unknown task_id {task_id!r}; expected state-0 .. state-{self.n_states - 1}"
            )
        return int(number)

    def sample_rewards(self, states: np.ndarray, arms: np.ndarray) -> np.ndarray:
        """Rewards of pulling ``arms[i]`` in ``states[i]`` (vectorised; uses ``self.np_random``)."""
        states, arms = np.asarray(states), np.asarray(arms)
        if states.shape != arms.shape:
            raise ValueError(f"states {states.shape} and arms {arms.shape} must have one shape")
        if arms.size and (arms.min() < 0 or arms.max() >= self.n_arms):
            raise ValueError(f"arms must be in 0..{self.n_arms - 1}")
        means = self.reward_means[states, arms]
        if self.reward_noise == "none":
            return means.astype(np.float64)
        return (self.np_random.random(means.shape) < means).astype(np.float64)

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        state = self.state_of(task_id)
        prompt = (
            f"Bandit state {state} of {self.n_states}. There are {self.n_arms} arms, numbered 0 "
            f"to {self.n_arms - 1}. Pull one arm: answer with its number only."
        )
        return prompt, {"state": state}

    def _respond(self, action: str) -> Turn:
        state = self.state_of(self.task_id)
        match = _ARM.search(action)
        arm = int(match.group()) if match else -1
        if not 0 <= arm < self.n_arms:
            return Turn(
                observation=f"No valid arm in the answer (expected 0..{self.n_arms - 1}).",
                done=True,
                reward_parts={"arm_mean": 0.0},
                info={"invalid_action": True, "arm": None},
            )
        reward = float(self.sample_rewards(np.array([state]), np.array([arm]))[0])
        mean = float(self.reward_means[state, arm])
        best = bool(mean >= self.reward_means[state].max())
        return Turn(
            observation=f"Arm {arm} paid {reward:g}.",
            done=True,
            reward=reward,
            success=best,
            reward_parts={"arm_mean": mean},
            info={"arm": arm},
        )
