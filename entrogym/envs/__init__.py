"""Text environments and their Gymnasium registration.

``import entrogym`` imports this module, which registers the built-in ids with
``gymnasium.register``. Entry points are strings, so nothing heavy (and no module written for
another env family) is imported until ``gymnasium.make`` asks for that env.

========================  =====================================================================
id                        task
========================  =====================================================================
entrogym/AIME-v0          AIME 2024 (30 problems, split ``test``)
entrogym/AIME2025-v0      AIME 2025 (30 problems, split ``test``)
entrogym/AMC-v0           AMC 12 2023 (40 problems, split ``test``)
entrogym/AIMETrain-v0     AIME 1983-2023 (918 problems, split ``train``)
entrogym/Arithmetic-v0    generated +/- problems (splits ``train`` and ``test``)
entrogym/Bandit-v0        tabular softmax bandit lab
entrogym/AppWorld-v0      AppWorld tasks (multi-turn, tool use)
entrogym/ReasoningGym-v0  a reasoning-gym dataset or a weighted mix (``reasoning-gym`` extra)
entrogym/TextArena-v0     a single-player TextArena game, multi-turn (``textarena`` extra)
entrogym/World-v0         a small AppWorld-shaped world of apps, multi-turn, with tools
========================  =====================================================================
"""

from __future__ import annotations

import gymnasium as gym

from entrogym.envs.base import TextEnv, Turn, is_text_env, make_text_env, task_ids_of
from entrogym.envs.checker import TextEnvCheckError, check_text_env
from entrogym.envs.contract import DEFAULT_REWARD_RANGE, EnvContractError, TextEnvProtocol
from entrogym.envs.spaces import UnicodeText
from entrogym.envs.tool_env import ToolEnv
from entrogym.envs.tools import AgentMessage, ToolCall, ToolDefinitionError, tool, tool_schema

__all__ = [
    "AgentMessage",
    "BUILTIN_ENV_IDS",
    "DEFAULT_REWARD_RANGE",
    "EnvContractError",
    "TextEnv",
    "TextEnvCheckError",
    "TextEnvProtocol",
    "ToolCall",
    "ToolDefinitionError",
    "ToolEnv",
    "Turn",
    "UnicodeText",
    "check_text_env",
    "is_text_env",
    "make_text_env",
    "task_ids_of",
    "tool",
    "tool_schema",
]

_MATH = "entrogym.envs.math_env:MathEnv"

# id -> (entry point, default keyword arguments; gymnasium.make(id, **kw) overrides them)
_BUILTINS: dict[str, tuple[str, dict]] = {
    "entrogym/AIME-v0": (_MATH, {"dataset": "aime_2024"}),
    "entrogym/AIME2025-v0": (_MATH, {"dataset": "aime_2025"}),
    "entrogym/AMC-v0": (_MATH, {"dataset": "amc_2023"}),
    "entrogym/AIMETrain-v0": (_MATH, {"dataset": "aime_1983_2023"}),
    "entrogym/Arithmetic-v0": ("entrogym.envs.arithmetic:ArithmeticEnv", {}),
    "entrogym/Bandit-v0": ("entrogym.envs.bandit:BanditEnv", {}),
    "entrogym/AppWorld-v0": ("entrogym.envs.appworld.env:AppWorldEnv", {}),
    "entrogym/ReasoningGym-v0": ("entrogym.envs.reasoning_gym_env:ReasoningGymEnv", {}),
    "entrogym/TextArena-v0": ("entrogym.envs.textarena_env:TextArenaEnv", {}),
    "entrogym/World-v0": ("entrogym.envs.world.env:WorldEnv", {}),
}

BUILTIN_ENV_IDS: tuple[str, ...] = tuple(_BUILTINS)


def _register_builtins() -> None:
    for env_id, (entry_point, kwargs) in _BUILTINS.items():
        if env_id in gym.registry:  # a reload must not warn about overriding
            continue
        gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))


_register_builtins()
