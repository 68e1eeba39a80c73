"""A new text env, registered the Gymnasium way and used through entrogym's public API.

``UnscrambleEnv`` asks for the English word hidden in scrambled letters and gives the agent up
to ``max_guesses`` tries (multi-turn: a wrong guess gets feedback). The reward is terminal:
1 for the word, minus 0.25 for each wrong guess before it; 0 if the guesses run out.

Run it: ``python examples/custom_env.py``. It checks the env with Gymnasium's ``check_env``
and entrogym's ``check_text_env`` (the text-env contract: stable task ids and prompts, terminal
rewards within ``reward_range``, ``end_episode``, action truncation), then rolls it out with a
scripted policy (a dictionary solver that guesses wrong once on purpose). Another script or an entrogym command can name it as
``"custom_env:examples/Unscramble-v0"`` when this directory is on ``sys.path``:
``gymnasium.make`` imports the module before the ``:``, which registers the id.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

import entrogym  # noqa: F401  (registers the built-in envs; not needed for this one)
from entrogym.envs import TextEnv, Turn, check_text_env, make_text_env, task_ids_of

WORDS = [
    "planet",
    "garden",
    "silver",
    "window",
    "pencil",
    "orange",
    "rocket",
    "basket",
    "candle",
    "forest",
    "guitar",
    "island",
    "jacket",
    "kitten",
    "lemon",
    "marble",
]
TEST_WORDS = ["python", "tunnel", "violet", "yellow"]


class UnscrambleEnv(TextEnv):
    """Find the word whose letters are scrambled; ``max_guesses`` turns at most."""

    reward_range = (0.0, 1.0)  # the default, stated: 1 minus 0.25 per wrong guess, or 0

    def __init__(self, *, max_guesses: int = 3, render_mode: str | None = None) -> None:
        super().__init__(split="train", max_turns=max_guesses, render_mode=render_mode)
        self._words = {"train": WORDS, "test": TEST_WORDS}

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def task_ids(self, split: str | None = None) -> list[str]:
        name = self.resolve_split(split)
        return [f"{name}-{word}" for word in self._words[name]]

    def _word(self, task_id: str) -> str:
        return task_id.split("-", 1)[1]

    def _start_task(self, task_id: str) -> tuple[str, dict[str, Any]]:
        word = self._word(task_id)
        # A fixed scramble per word, so a task is the same prompt every time.
        rng = np.random.default_rng(sum(map(ord, word)))
        letters = "".join(rng.permutation(list(word)))
        prompt = (
            f"Unscramble the letters '{letters}' into an English word. Reply with the word only."
        )
        return prompt, {"letters": letters}

    def _respond(self, action: str) -> Turn:
        assert self._task_id is not None
        word = self._word(self._task_id)
        words = action.strip().lower().split()
        guess = words[-1].strip(".!'\"") if words else ""
        if guess == word:
            penalty = -0.25 * self.turn  # every earlier turn was a wrong guess
            return Turn(
                observation="Correct!",
                done=True,
                reward=1.0 + penalty,
                success=True,
                reward_parts={"solved": 1.0, "wrong_guess_penalty": penalty},
            )
        return Turn(observation=f"No, '{guess}' is not it. Try again.", info={"guess": guess})

    def _on_truncate(self) -> Turn:
        return Turn(done=True, reward=0.0, success=False, reward_parts={"solved": 0.0})


gym.register(id="examples/Unscramble-v0", entry_point=UnscrambleEnv, kwargs={"max_guesses": 3})


def scripted_policy(observation: str, first_turn: bool) -> str:
    """Solve by sorted-letter lookup, after one deliberate wrong guess to show the multi-turn path."""
    if first_turn:
        return "stone"
    letters = observation.split("'")[1] if "'" in observation else ""
    for word in WORDS + TEST_WORDS:
        if sorted(word) == sorted(letters):
            return word
    return "unknown"


def main() -> dict[str, float]:
    env = make_text_env("examples/Unscramble-v0", render_mode="ansi")
    check_env(env.unwrapped, skip_render_check=True)
    check_text_env(env, max_tasks=len(WORDS))  # raises, naming the check and the task, if broken
    rewards: dict[str, float] = {}
    for task_id in task_ids_of(env, "test"):
        observation, info = env.reset(options={"task_id": task_id})
        prompt, terminated, truncated, first = observation, False, False, True
        while not (terminated or truncated):
            action = scripted_policy(prompt, first)
            observation, reward, terminated, truncated, info = env.step(action)
            first = False
        rewards[task_id] = reward
        print(f"{task_id}: reward {reward:+.2f}, parts {info['reward_parts']}")
    print(env.render())
    env.close()
    return rewards


if __name__ == "__main__":
    main()
