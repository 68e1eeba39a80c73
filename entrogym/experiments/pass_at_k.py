"""pass@k of a final policy, as a pool job: what the demo and the sequential experiment report.

A collapsed policy's pass@k equals its pass@1; a policy that kept its entropy reaches more
problems with more samples (the paper's first claim). Each job scores one adapter (or the base
model) on the first held-out tasks of an env with many samples per task.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from entrogym.agents.config import AgentConfig
from entrogym.experiments.config import demo_agent


@dataclass(frozen=True)
class Task:
    """A registered env and its kwargs, the split held out for evaluation, and the run
    settings the task needs beside the demo's.

    Attributes:
        env: the env id.
        env_kwargs: its keyword arguments.
        held_out: the split evaluated (and scored for pass@k) after training.
        settings: ``TrainConfig`` fields that replace the demo's when training or evaluating
            on this task (a multi-turn env's tool format and context, say); the rollout ones
            among them apply to pass@k too.
    """

    env: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    held_out: str = "test"
    settings: dict[str, Any] = field(default_factory=dict)

    def agent_settings(self) -> dict[str, Any]:
        """The ``settings`` that are rollout settings (``AgentConfig`` fields)."""
        names = {f.name for f in fields(AgentConfig)}
        return {k: v for k, v in self.settings.items() if k in names}


@dataclass(frozen=True)
class PassJob:
    """pass@k of ``adapter`` (None: the base model) on ``task``'s first held-out tasks."""

    label: str
    seed: int
    task: Task
    adapter: str | None
    tasks: int
    samples: int
    threads: int
    engine: str
    model: str | None = None


def final_adapter(folder: Path) -> str:
    """The adapter of a finished run's last checkpoint."""
    checkpoints = sorted((folder / "checkpoints").glob("iter-*[0-9]"))
    if not checkpoints:
        raise RuntimeError(f"{folder} has no checkpoint; its final adapter is needed")
    return str(checkpoints[-1] / "adapter")


def pass_at_k_of(job: PassJob) -> dict[str, float]:
    """Unbiased pass@k (k = 1, 4, 16, 64 up to the samples, and the samples) of the job's
    policy and its mean number of distinct correct answers per task (``distinct``), sampled as
    the trainer's eval rows sample (temperature 1, seeded with the job's seed)."""
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.train.devices.precision import apply_threads
    from entrogym.train.evaluation.evaluate import evaluate_policy
    from entrogym.train.evaluation.scores import pass_at_ks

    apply_threads(job.threads)
    cfg = replace(demo_agent(job.engine, job.model), **job.task.agent_settings())
    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=job.seed))
    try:
        agent = LLMAgent.from_model(cfg.model, **cfg.agent_kwargs())
        result = evaluate_policy(engine, agent, job.task.env, split=job.task.held_out,
                                 samples=job.samples, max_tasks=job.tasks, adapter=job.adapter,
                                 temperature=1.0, seed=job.seed,
                                 env_kwargs=job.task.env_kwargs)  # fmt: skip
    finally:
        engine.close()
    summary = result.summary
    scores = {str(k): summary[f"pass@{k}"] for k in pass_at_ks(job.samples)}
    return {**scores, "distinct": summary.get("distinct_correct_mean")}


def pass_line(scores: dict[str, float]) -> str:
    """``@1=0.823 @4=0.877 ...``: the k's of a pass_at_k_of result (not ``distinct``)."""
    return " ".join(f"@{k}={v:.3f}" for k, v in scores.items() if k.isdigit())
