"""The LLM agent, the inference engines and rollout collection.

The public face is loaded lazily (PEP 562), so importing ``entrogym.agents.config`` does not
import an engine::

    from entrogym.agents import LLMAgent, make_engine, collect_rollouts, Episode
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AgentConfig": "entrogym.agents.config",
    "LLMAgent": "entrogym.agents.agent",
    "Episode": "entrogym.agents.episode",
    "EnvErrorBudgetExceeded": "entrogym.agents.episode",
    "check_env_errors": "entrogym.agents.episode",
    "collect_rollouts": "entrogym.agents.rollout",
    "Engine": "entrogym.agents.engines",
    "ENGINE_KINDS": "entrogym.agents.engines",
    "SamplingParams": "entrogym.agents.engines",
    "make_engine": "entrogym.agents.engines",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'entrogym.agents' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
