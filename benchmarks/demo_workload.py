"""The demo's workload, which the throughput, precision and claim benchmarks measure on.

What ``entrogym demo`` trains (docs/demo.md): SmolLM2-135M-Instruct through the ``hf`` engine in
fp32 (``AGENT``: 48 response tokens, 256 context tokens, the demo's system prompt), one-digit
``entrogym/Arithmetic-v0`` (``ENV``, ``ENV_KWARGS``), the demo's learning rate and one run's
``TrainConfig`` (``demo_config``). The benchmarks read it from here, the one module of theirs
that imports the demo, and only through its public exports (``entrogym.experiments.__all__``), so a
change to the demo's settings reaches every benchmark that measures on them. The world study
takes the demo's world record (``record_world``) from here too.
"""

from __future__ import annotations

from entrogym.experiments import (
    AGENT,
    DEFAULT_LR,
    DEFAULT_RUNS,
    ENV,
    ENV_KWARGS,
    PAIRS,
    SYSTEM_PROMPT,
    demo_agent,
    demo_config,
    record_world,
)

__all__ = [
    "AGENT", "DEFAULT_LR", "DEFAULT_RUNS", "ENV", "ENV_KWARGS", "PAIRS", "SYSTEM_PROMPT", "demo_agent", "demo_config",
    "demo_prompts", "record_world",
]  # fmt: skip


def demo_prompts(model: str, tasks: int, k: int) -> tuple[object, list[list[int]]]:
    """The demo's agent for ``model`` and the token ids of its first ``tasks`` training prompts,
    each ``k`` times (a group of K rollouts per task): the rollout benchmarks' workload."""
    from entrogym.agents.agent import LLMAgent
    from entrogym.envs.base import make_text_env, task_ids_of

    env = make_text_env(ENV, **ENV_KWARGS)
    agent = LLMAgent.from_model(model, **AGENT.agent_kwargs())
    prompts = []
    for task in task_ids_of(env, "train")[:tasks]:
        obs, _ = env.reset(options={"task_id": task})
        prompts += [agent.start(obs).token_ids] * k
    env.close()
    return agent, prompts
