"""entrogym: entropy-preserving reinforcement learning of language-model policies.

Importing the package registers the built-in environments with Gymnasium, exactly as
``import gymnasium`` registers the classic-control ones::

    import gymnasium as gym
    import entrogym  # noqa: F401

    env = gym.make("entrogym/Arithmetic-v0")
"""

from entrogym import envs as _envs  # noqa: F401  (registers the env ids)

__version__ = "0.1.0"
