"""The multi-turn benchmarks' env (``multiturn_env:Talk-v0``): a conversation of ``turns``
turns whose every step takes ``latency_ms`` (an env server's round trip, AppWorld's stand-in)
and answers with a fixed reply; reward 1 at the end. Importable by env worker processes."""

from __future__ import annotations

import time

import gymnasium as gym

from entrogym.envs.base import TextEnv, Turn

REPLY = "Noted. Now say it again in other words, one short sentence, and nothing else."


class Talk(TextEnv):
    splits = ("train",)

    def __init__(self, turns: int = 4, latency_ms: float = 0.0, tasks: int = 64) -> None:
        super().__init__(max_turns=turns)
        self.turns, self.latency_s, self.tasks = turns, latency_ms / 1000, tasks

    def task_ids(self, split=None):
        return [f"talk-{i}" for i in range(self.tasks)]

    def _start_task(self, task_id):
        return f"Conversation {task_id}: tell me one fact about the number {task_id[5:]}.", {}

    def _respond(self, action):
        if self.latency_s:
            time.sleep(self.latency_s)
        n = self._turn + 1
        done = n >= self.turns
        return Turn(REPLY, done=done, reward=float(done), success=done)


if "Talk-v0" not in gym.registry:
    gym.register(id="Talk-v0", entry_point=Talk)
