"""The unit of experience passed from rollouts to the trainer, and the bookkeeping of the
episodes that env errors failed (see :mod:`entrogym.agents.rollout`)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Episode:
    """One trajectory of one task, token-exact.

    ``token_ids`` is the whole conversation as the engine saw it (prompt, sampled completions,
    env feedback turns); ``action_mask[i] == 1`` exactly where ``token_ids[i]`` was sampled by the
    policy. ``sampler_logprobs[i]`` is the engine's log-prob of ``token_ids[i]`` where the mask is
    1 and 0.0 elsewhere. The ids are never re-tokenized: the trainer scores these very ids.

    ``error`` is set when an env error ended the episode (an exception in the env, or a reply
    that breaks the text-env contract); it names the env id, the task id, and the exception's
    type and text. Such an episode is :attr:`failed`: its reward is 0, it is not training data,
    and if its reset failed it has no tokens at all.
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
    error: str | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.action_mask) != n or len(self.sampler_logprobs) != n:
            raise ValueError(
                f"Episode {self.task_id!r}: token_ids ({n}), action_mask ({len(self.action_mask)}) "
                f"and sampler_logprobs ({len(self.sampler_logprobs)}) must have equal lengths"
            )

    @property
    def failed(self) -> bool:
        """Whether an env error ended this episode (see ``error``)."""
        return self.error is not None

    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.action_mask))


class EnvErrorBudgetExceeded(RuntimeError):
    """More episodes failed on env errors than the run allows (``max_env_error_fraction``)."""


def check_env_errors(episodes: Sequence[Episode], max_fraction: float) -> None:
    """Raise :class:`EnvErrorBudgetExceeded`, naming the first failure, when the share of
    failed episodes is above ``max_fraction`` (in [0, 1])."""
    if not isinstance(max_fraction, int | float) or not 0 <= max_fraction <= 1:
        raise ValueError(f"max_fraction must be a number in [0, 1], got {max_fraction!r}")
    failed = [e for e in episodes if e.failed]
    if episodes and len(failed) / len(episodes) > max_fraction:
        raise EnvErrorBudgetExceeded(
            f"{len(failed)} of {len(episodes)} episodes failed on env errors, more than "
            f"max_env_error_fraction={max_fraction:g}; the first: {failed[0].error}"
        )


_logged_lock = threading.Lock()
_logged: set[str] = set()
_MAX_LOGGED = 10_000  # distinct messages remembered; past that each is logged again


def log_env_error_once(key: str, message: str) -> None:
    """Write an env error's ``message`` to stderr, once per process for each ``key`` (the
    error without its task id: a broken env fails every task the same way)."""
    with _logged_lock:
        if key in _logged:
            return
        if len(_logged) >= _MAX_LOGGED:
            _logged.clear()
        _logged.add(key)
    print(
        f"entrogym: episode failed on an env error (left out of training; later episodes with "
        f"this error are only counted in env_errors): {message}",
        file=sys.stderr,
        flush=True,
    )
