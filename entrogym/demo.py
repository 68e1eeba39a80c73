"""``entrogym demo`` (what ``make demo`` runs): REPO-R against GRPO on SmolLM2, on a CPU budget.

One in-process vLLM engine serves everything: the base model is evaluated on held-out
arithmetic, then SmolLM2-135M-Instruct is RL-trained with each preset through the real trainer
(vLLM rollouts, fp32 log-probs, LoRA, the preset's entropy control), and each final adapter is
evaluated the same way. Writes ``OUT/<algo>/`` run folders, ``OUT/plots/*.png`` (the paper's
Figure 1 panels) and ``OUT/summary.json``, and prints the table.

The budget is sized for 2 CPU cores (the README gives the measured time). Against the paper's
setting it changes only what a CPU forces: fewer tasks and rollouts per iteration, one epoch
with two minibatches, a learning rate that moves a LoRA policy within a few iterations, and
one-digit arithmetic so that a 135M model earns some reward.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from entrogym.agents.config import AgentConfig
from entrogym.atomic import atomic_write_text

ENV = "entrogym/Arithmetic-v0"
ENV_KWARGS = {"max_digits": 1, "num_train": 100, "num_test": 40}
SYSTEM_PROMPT = "You are a careful calculator. Answer with the final number in \\boxed{}."
# The rollout settings every part of the demo shares (the base model's eval and both runs).
AGENT = AgentConfig(
    model="smollm2-135m-instruct",
    engine="vllm",
    engine_dtype="fp32",
    max_response_tokens=48,
    max_context_tokens=256,
    on_turn_budget="step",
    system_prompt=SYSTEM_PROMPT,
)


def demo_config(algo: str, out: Path, iterations: int, lr: float, eval_tasks: int) -> Any:
    from entrogym.train.config import TrainConfig

    tasks, samples = 6, 4
    return TrainConfig(
        **asdict(AGENT),
        env=ENV,
        env_kwargs=ENV_KWARGS,
        split="train",
        # one pass, two optimizer steps per iteration: the second minibatch is off-policy,
        # so the presets' clipping and REPO's shaping both act
        algo={"name": algo, "epochs": 1, "minibatch_size": tasks * samples // 2},
        dtype="fp32",
        iterations=iterations,
        tasks_per_iter=tasks,
        samples=samples,
        early_stop_min_per_task=samples,
        early_stop_fraction=1.0,
        lr=lr,
        micro_batch_size=6,
        checkpoint_every=iterations,
        # held-out accuracy after the first and the last update (the plots' accuracy panels)
        eval_env=ENV,
        eval_env_kwargs=ENV_KWARGS,
        eval_split="test",
        eval_every=iterations,
        eval_tasks=eval_tasks,
        out=str(out / algo),
    )


def evaluate_base(engine: Any, agent: Any, tasks: int) -> float:
    """Held-out accuracy of the base model, as the trainer's eval rows measure it."""
    from entrogym.train.evaluation import evaluate_policy

    result = evaluate_policy(
        engine, agent, ENV, split="test", max_tasks=tasks, temperature=1.0, env_kwargs=ENV_KWARGS
    )
    return float(result.summary["pass@1"])


def run_demo(out: Path, algos: list[str], iterations: int, lr: float, eval_tasks: int) -> None:
    """Evaluate the base model, train each preset, evaluate again, plot and print the table.
    A non-empty ``out`` is refused (ValueError) so no earlier result is mixed in."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; remove it or pass --out NEW_DIR")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vllm is imported
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.models import resolve_model
    from entrogym.train.plots import plot_runs

    start = time.perf_counter()
    resolve_model(AGENT.model)  # dequantises the shipped GGUF once
    configs = {a: demo_config(a, out, iterations, lr, eval_tasks) for a in algos}
    engine = make_engine(AGENT.engine, AGENT.model, **AGENT.engine_kwargs())
    agent = LLMAgent.from_model(AGENT.model, **AGENT.agent_kwargs())
    settings = {"out": str(out), "algos": algos, "iterations": iterations, "lr": lr,
                "eval_tasks": eval_tasks, "env": ENV, "env_kwargs": ENV_KWARGS}  # fmt: skip
    summary: dict[str, Any] = {"settings": settings}
    try:
        summary["accuracy_before"] = before = evaluate_base(engine, agent, eval_tasks)
        print(f"base model: held-out accuracy {before:.3f}", flush=True)
        for algo in algos:
            summary[algo] = train_one(configs[algo], engine)
    finally:
        engine.close()
    for path in plot_runs([str(out / a) for a in algos], out / "plots"):
        print(path)
    summary["wall_s"] = time.perf_counter() - start
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(report(summary, algos))


def train_one(config: Any, engine: Any) -> dict[str, Any]:
    """Train one preset through the real trainer; its entropy, reward and final accuracy."""
    from entrogym.train.trainer import Trainer

    trainer = Trainer(config, engine=engine)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
    train = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    return {
        "entropy": [r["entropy"] for r in train],
        "entropy_ratio": train[-1]["entropy"] / train[0]["entropy"],
        "reward": [r["reward_mean"] for r in train],
        "accuracy_after": evals[-1]["pass@1"],
    }


def report(summary: dict[str, Any], algos: list[str]) -> str:
    lines = [
        f"held-out accuracy of the base model: {summary['accuracy_before']:.3f}",
        f"{'preset':<8} {'entropy first -> last':>24} {'ratio':>6} {'reward first -> last':>21} "
        f"{'accuracy after':>15}",
    ]
    for algo in algos:
        r = summary[algo]
        lines.append(
            f"{algo:<8} {r['entropy'][0]:>11.4f} -> {r['entropy'][-1]:<9.4f} "
            f"{r['entropy_ratio']:>6.2f} {r['reward'][0]:>9.3f} -> {r['reward'][-1]:<8.3f} "
            f"{r['accuracy_after']:>15.3f}"
        )
    if "grpo" in summary and "repo-r" in summary:
        held = summary["repo-r"]["entropy_ratio"] > summary["grpo"]["entropy_ratio"]
        lines.append(
            "REPO-R kept more of its entropy than GRPO"
            if held
            else "REPO-R did NOT keep more of its entropy than GRPO in this run"
        )
    lines.append(f"wall time {summary['wall_s']:.0f} s")
    return "\n".join(lines)
