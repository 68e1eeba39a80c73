"""The multi-turn benchmarks' envs, importable by env worker processes.

- ``multiturn_env:Talk-v0``: a conversation of ``turns`` turns whose every step takes
  ``latency_ms`` (an env server's round trip, AppWorld's stand-in) and answers with a fixed
  reply; reward 1 at the end.
- :class:`TalkTools`: the same conversation as a class written for TRL's
  ``GRPOTrainer(environment_factory=...)``: one tool, ``say``, which takes
  ``$ENTROGYM_BENCH_TOOL_LATENCY_MS`` and answers with the same reply. TRL trains it as it is;
  entrogym trains it as ``multiturn_env:TalkTools-v0`` (:class:`TalkToolsEnv`), the same class
  behind its TRL-style wrapper.

Equal work needs every episode to run the same number of turns on both sides, whatever a
model writes: :class:`TalkToolsEnv` reads every turn but the last as one call to ``say`` with
the turn's text, and the TRL worker reads TRL's parsed turns the same way (``bench_trl.py``,
``force_say``). In both, the last turn calls nothing (TRL's ``max_tool_calling_iterations``
is turns - 1), so an episode of N turns steps the tool N - 1 times.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym

from entrogym.envs.base import TextEnv, Turn
from entrogym.envs.trl_style import TRLStyleEnv

REPLY = "Noted. Now say it again in other words, one short sentence, and nothing else."
LATENCY_VARIABLE = "ENTROGYM_BENCH_TOOL_LATENCY_MS"


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


def set_tool_latency(ms: float) -> None:
    """:class:`TalkTools`' latency for this process and the env workers it starts."""
    os.environ[LATENCY_VARIABLE] = repr(float(ms))


class TalkTools:
    """A conversation with one tool (TRL's ``environment_factory`` contract): ``reset`` starts
    it, ``say`` answers after the env's latency, ``get_reward`` scores what was said."""

    def reset(self, **kwargs) -> None:
        self.said: list[str] = []
        # read per episode: env worker processes inherit the variable the benchmark sets
        self.latency_s = float(os.environ.get(LATENCY_VARIABLE, "0")) / 1000

    def say(self, text: str) -> str:
        """
        Say one sentence to the user.

        Args:
            text: The sentence.

        Returns:
            The user's answer.
        """
        if self.latency_s:
            time.sleep(self.latency_s)
        self.said.append(text)
        return REPLY

    def get_reward(self) -> float:
        # varies with what was said, so that GRPO's advantages are not all zero
        return float(sum(len(t) for t in self.said) % 2)


class TalkToolsEnv(TRLStyleEnv):
    """:class:`TalkTools` behind entrogym's TRL-style wrapper, every turn but the last read as
    ``say(text=turn)`` (module docstring); ``max_turns`` turns an episode."""

    def __init__(self, **kwargs) -> None:
        super().__init__(TalkTools, **kwargs)

    def _respond(self, action: str) -> Turn:
        if self._turn + 1 >= self.max_turns:
            return self._grade()
        return Turn(self.inner.say(text=action), info={"tool_calls": 1, "tool_errors": 0})


for _id, _entry in (("Talk-v0", Talk), ("TalkTools-v0", TalkToolsEnv)):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)
