"""Evaluation of a policy on an env split: pass@1 and pass@k over K samples per task."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import Engine, SamplingParams
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class EvalResult:
    summary: dict[str, Any]
    per_task: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[Any] = field(default_factory=list)


def evaluate_policy(
    engine: Engine,
    agent: LLMAgent,
    env_id: str,
    *,
    split: str | None = None,
    samples: int = 1,
    max_tasks: int | None = None,
    adapter: str | None = None,
    temperature: float = 1.0,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
) -> EvalResult:
    """Roll out ``samples`` episodes of every task of the split (no early stopping).

    Success is the env's ``info["success"]`` (AppWorld: all tests pass; math: correct answer).
    Reports ``pass@1`` (mean success over all samples) and ``pass@k`` for k = ``samples``.
    """
    env = make_text_env(env_id, **(env_kwargs or {}))
    tasks = task_ids_of(env, split)
    env.close()
    if max_tasks is not None:
        tasks = tasks[:max_tasks]
    if not tasks:
        raise ValueError(f"env {env_id!r} has no tasks in split {split!r}")
    episodes = collect_rollouts(
        env_id,
        tasks,
        engine,
        agent,
        k=samples,
        sampling=SamplingParams(temperature=temperature),
        adapter=adapter,
        early_stop=False,
        env_kwargs=env_kwargs,
        seed=seed,
    )
    per_task = []
    for task in tasks:
        eps = [e for e in episodes if e.task_id == task]
        correct = sum(bool(e.info.get("success", e.reward >= 1.0)) for e in eps)
        per_task.append(
            {
                "task_id": task,
                "samples": len(eps),
                "correct": correct,
                "rewards": [e.reward for e in eps],
            }
        )
    scored = [t for t in per_task if t["samples"] > 0]
    k = samples
    summary = {
        "tasks": len(tasks),
        "samples": samples,
        "pass@1": sum(t["correct"] / t["samples"] for t in scored) / max(len(scored), 1),
        f"pass@{k}": sum(
            pass_at_k(t["samples"], t["correct"], min(k, t["samples"])) for t in scored
        )
        / max(len(scored), 1),
        "reward_mean": sum(e.reward for e in episodes) / max(len(episodes), 1),
    }
    return EvalResult(summary=summary, per_task=per_task, episodes=list(episodes))
