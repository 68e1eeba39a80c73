"""The unit of experience passed from rollouts to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One trajectory of one task, token-exact.

    ``token_ids`` is the whole conversation as the engine saw it (prompt, sampled completions,
    env feedback turns); ``action_mask[i] == 1`` exactly where ``token_ids[i]`` was sampled by the
    policy. ``sampler_logprobs[i]`` is the engine's log-prob of ``token_ids[i]`` where the mask is
    1 and 0.0 elsewhere. The ids are never re-tokenized: the trainer scores these very ids.
    """

    task_id: str
    group_id: int
    token_ids: list[int]
    action_mask: list[int]
    sampler_logprobs: list[float]
    reward: float
    info: dict[str, Any] = field(default_factory=dict)
    num_turns: int = 0
    truncated: bool = False
    env_id: str = ""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.action_mask) != n or len(self.sampler_logprobs) != n:
            raise ValueError(
                f"Episode {self.task_id!r}: token_ids ({n}), action_mask ({len(self.action_mask)}) "
                f"and sampler_logprobs ({len(self.sampler_logprobs)}) must have equal lengths"
            )

    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.action_mask))
