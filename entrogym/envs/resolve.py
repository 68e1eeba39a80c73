"""What ``--env module:Name`` names: a registered Gymnasium id, or an env class.

``module:Name`` imports ``module`` first (as ``gymnasium.make`` does). When that registers an
id ``Name``, it is that env. Otherwise ``Name`` may be a class in ``module``:

- a Gymnasium env class (e.g. a :class:`~entrogym.envs.TextEnv` subclass), registered as it is;
- a class written for TRL's ``environment_factory`` (:func:`~entrogym.envs.trl_style.is_trl_style`),
  registered wrapped in :class:`~entrogym.envs.trl_style.TRLStyleEnv`;

under the id ``module.Name``, which :func:`resolve_env_id` returns. Anything else is a
ValueError saying what an env must be. Env worker processes resolve the same string the same
way, so a class needs no registration code of its own.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["RESERVED_METHODS", "env_takes_keyword", "is_trl_style", "resolve_env_id", "trl_tools"]

# TRL's environment_factory contract: these methods are the env's own, every other public one a tool
RESERVED_METHODS = ("reset", "get_reward")


def _public_functions(cls: type) -> list[str]:
    """Names of the public functions of ``cls`` other than the reserved ones, as TRL lists
    them (``inspect.getmembers`` on the class, so properties are not evaluated)."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED_METHODS and not name.startswith("_")
    ]


def is_trl_style(obj: Any) -> bool:
    """Whether ``obj`` is a class written for TRL's ``environment_factory``: not a Gymnasium
    env, with a ``reset`` method and at least one public method (its tools)."""
    import gymnasium as gym

    return (
        inspect.isclass(obj)
        and not issubclass(obj, gym.Env)
        and inspect.isfunction(getattr(obj, "reset", None))
        and bool(_public_functions(obj))
    )


def trl_tools(instance: Any) -> list[Callable[..., Any]]:
    """The bound tool methods of a TRL-style env instance."""
    return [getattr(instance, name) for name in _public_functions(type(instance))]


def resolve_env_id(env_id: str) -> str:
    """The Gymnasium id to make for ``env_id`` (module docstring): ``env_id`` itself unless it
    names an env class, which is registered (once) under the returned id."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if not module:
        return env_id
    imported = importlib.import_module(module)
    if name in gym.registry:
        return env_id
    obj = getattr(imported, name, None)
    if obj is None:
        return env_id  # not a class: gymnasium.make names the unknown id
    registered = f"{module}.{name}"
    if registered in gym.registry:
        return registered
    if inspect.isclass(obj) and issubclass(obj, gym.Env):
        gym.register(id=registered, entry_point=obj)
    elif is_trl_style(obj):
        gym.register(
            id=registered,
            entry_point="entrogym.envs.trl_style:TRLStyleEnv",
            kwargs={"env_class": f"{module}:{name}"},
        )
    else:
        raise ValueError(
            f"env {env_id!r} names {_describe(obj)}, which is neither a text env (a subclass of "
            "entrogym.envs.TextEnv) nor a TRL-style env (a class with a reset method and "
            "documented public methods as tools); pass one of those or a registered env id"
        )
    return registered


def _describe(obj: object) -> str:
    if inspect.isclass(obj):
        return f"the class {obj.__qualname__}"
    return f"a {type(obj).__name__}"


def env_takes_keyword(env_id: str, name: str) -> bool:
    """Whether the env ``env_id`` is made with a keyword argument ``name`` (its registration
    sets it, or its constructor names it; ``**kwargs`` does not count)."""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    spec = gym.spec(resolve_env_id(env_id).rpartition(":")[2])
    if name in (spec.kwargs or {}):
        return True
    entry = spec.entry_point
    creator = entry if callable(entry) else load_env_creator(entry)
    try:
        parameters = inspect.signature(creator).parameters
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return name in parameters and parameters[name].kind in kinds
