"""Evaluation of a policy on an env split: pass@1 and pass@k over K samples per task.

Used by the trainer's in-run evaluation and by ``entrogym eval``. Without a split, both evaluate
the env's held-out split (:func:`held_out_split`), never the training split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import comb
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import Engine, SamplingParams
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al., 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass_at_k needs n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n (samples per task), got k={k}, n={n}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(correct: Mapping[str, Sequence[bool]], k: int) -> float:
    """pass@k averaged over tasks; ``correct[task]`` holds one bool per sample. A task with
    fewer than ``k`` samples (early-stopped) counts with k = its sample count."""
    scored = {t: v for t, v in correct.items() if v}
    if not scored:
        raise ValueError("mean_pass_at_k needs at least one task with a sample")
    return sum(pass_at_k(len(v), sum(map(bool, v)), min(k, len(v))) for v in scored.values()) / len(
        scored
    )


def held_out_split(env: Any) -> str:
    """The split an evaluation uses by default: the env's declared ``eval_split`` attribute when
    it has one, else ``test``, else the first split whose name starts with ``test`` (AppWorld's
    ``test_normal``). An env with no such split is a ValueError: pass the split explicitly."""
    inner = env.unwrapped
    declared = getattr(inner, "eval_split", None)
    if declared:
        return str(declared)
    splits = tuple(getattr(inner, "splits", ()))
    for name in ("test", *(s for s in splits if s.startswith("test"))):
        if name in splits:
            return name
    raise ValueError(
        f"{type(inner).__name__} declares no held-out split (its splits: {list(splits)}); "
        "name the split to evaluate (--split / eval_split), or give the env an eval_split "
        "attribute"
    )


def eval_tasks(
    env_id: str, split: str | None, max_tasks: int | None, env_kwargs: dict[str, Any] | None
) -> tuple[str, list[str]]:
    """The split (None: the held-out one) and its first ``max_tasks`` task ids."""
    env = make_text_env(env_id, **(env_kwargs or {}))
    try:
        split = held_out_split(env) if split is None else split
        tasks = task_ids_of(env, split)
    finally:
        env.close()
    tasks = tasks[:max_tasks] if max_tasks is not None else tasks
    if not tasks:
        raise ValueError(f"env {env_id!r} has no tasks in split {split!r}")
    return split, tasks


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
    Reports ``split``, ``pass@1`` (mean success over all samples, also as ``accuracy``) and
    ``pass@k`` for k = ``samples``. ``split=None`` is the env's held-out split.
    """
    split, tasks = eval_tasks(env_id, split, max_tasks, env_kwargs)
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
    correct = {
        task: [bool(e.info.get("success", e.reward >= 1.0)) for e in episodes if e.task_id == task]
        for task in tasks
    }
    per_task = [
        {
            "task_id": task,
            "samples": len(correct[task]),
            "correct": sum(correct[task]),
            "rewards": [e.reward for e in episodes if e.task_id == task],
        }
        for task in tasks
    ]
    summary = {
        "split": split,
        "tasks": len(tasks),
        "samples": samples,
        "pass@1": mean_pass_at_k(correct, 1),
        "accuracy": mean_pass_at_k(correct, 1),
        f"pass@{samples}": mean_pass_at_k(correct, samples),
        "reward_mean": sum(e.reward for e in episodes) / max(len(episodes), 1),
    }
    return EvalResult(summary=summary, per_task=per_task, episodes=list(episodes))
