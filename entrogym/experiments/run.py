"""Running the demo: every (run, seed) and the base model's evaluation as jobs on a process pool
(``pool.py``), each trained run's pass@k queued the moment it ends.

Each job is its own process with its own ``hf`` engine and ``cores // workers`` torch threads:
on this project's 2-core machine two 1-thread runs side by side did 1.33x the iterations per
minute of one 2-thread run (docs/results.md, "2026-11-23 04:24").
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrogym.atomic import atomic_write_text
from entrogym.experiments.config import (
    AGENT,
    DEFAULT_SEEDS,
    ENV,
    ENV_KWARGS,
    PASS_SAMPLES,
    PASS_TASKS,
    DemoRun,
    demo_agent,
    demo_config,
)
from entrogym.experiments.log_labels import labelled_output
from entrogym.experiments.pass_at_k import PassJob, Task, final_adapter, pass_at_k_of, pass_line
from entrogym.experiments.pool import run_jobs
from entrogym.experiments.report import goal, plot_demo, report, shown_names
from entrogym.experiments.sequential_report import measured_line
from entrogym.experiments.world_record import recorded_world


@dataclass(frozen=True)
class Job:
    """One process's work: train ``config`` (label, seed), or evaluate the base model.
    ``spec`` is the run's spec without its ``NAME=`` (``grpo`` marks the goal's baseline);
    ``name`` its short name (default: the label), which its log lines carry with the seed."""

    label: str
    seed: int
    threads: int
    config: Any = None  # TrainConfig; None: the base model's held-out evaluation
    eval_tasks: int = 0
    engine: str = AGENT.engine
    spec: str = ""
    name: str = ""
    model: str | None = None  # the base model's evaluation: None is the demo's model


def run_job(job: Job | PassJob) -> dict[str, Any]:
    """Body of one pool process (also callable in-process). A run's threads are its config's
    (the trainer applies them); the base model's evaluation applies ``job.threads`` here."""
    if isinstance(job, PassJob):
        return {"label": job.label, "seed": job.seed, "pass_at_k": pass_at_k_of(job)}
    if job.config is None:
        from entrogym.train.devices.precision import apply_threads

        apply_threads(job.threads)
        accuracy = held_out_accuracy(job.engine, job.eval_tasks, job.seed, model=job.model)
        return {"accuracy_before": accuracy}
    with labelled_output(f"{job.name or job.label} s{job.seed}", job.config.algo.name):
        result = train_one(job.config)
    return {"label": job.label, "spec": job.spec or job.label, "seed": job.seed, **result}


def evaluate_base(engine_kind: str, tasks: int, seed: int) -> float:
    """Held-out accuracy of the base model, as the trainer's eval rows measure it."""
    return held_out_accuracy(engine_kind, tasks, seed)


def held_out_accuracy(engine_kind: str, tasks: int, seed: int, *, adapter: str | None = None,
                      model: str | None = None) -> float:  # fmt: skip
    """pass@1 on the first ``tasks`` test tasks of the demo's env with ``adapter`` (a peft
    folder; None: the base model), sampled as the trainer's eval rows sample (temperature 1,
    seeded with ``seed``): one grader for any adapter, whichever trainer made it."""
    from entrogym.agents.agent import LLMAgent
    from entrogym.agents.engines import make_engine
    from entrogym.train.evaluation.evaluate import evaluate_policy

    cfg = demo_agent(engine_kind, model)
    engine = make_engine(cfg.engine, cfg.model, **cfg.engine_kwargs(seed=seed))
    try:
        agent = LLMAgent.from_model(cfg.model, **cfg.agent_kwargs())
        result = evaluate_policy(engine, agent, ENV, split="test", max_tasks=tasks,
                                 adapter=adapter, temperature=1.0, seed=seed,
                                 env_kwargs=ENV_KWARGS)  # fmt: skip
    finally:
        engine.close()
    return float(result.summary["pass@1"])


def train_one(config: Any) -> dict[str, Any]:
    """Train one run through the real trainer; its entropy, reward, accuracy and wall time."""
    from entrogym.train.trainer import train

    start = time.perf_counter()
    run_dir = train(config)
    return run_record(config, run_dir, time.perf_counter() - start)


def run_record(config: Any, run_dir: Path, wall_s: float) -> dict[str, Any]:
    """A finished run's entropy, targets, reward, coefficient and accuracy, read from its
    ``metrics.jsonl`` (``config``: the TrainConfig it ran with)."""
    from entrogym.train.evaluation.target_tracking import filled_targets
    from entrogym.train.folder.metrics import read_metrics

    rows = read_metrics(run_dir)
    rows_t = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    # what the controller saw (exact or sampled), in its target's terms; sampled without one
    tracked = [r["entropy"] if r.get("entropy_tracked") is None else r["entropy_tracked"]
               for r in rows_t]  # fmt: skip
    return {
        "algo": config.algo.name,
        "folder": str(run_dir),
        "entropy": [r["entropy"] for r in rows_t],
        "entropy_tracked": tracked,
        "entropy_ratio": rows_t[-1]["entropy"] / rows_t[0]["entropy"],
        "reward": [r["reward_mean"] for r in rows_t],
        "zeta": [r.get("zeta") for r in rows_t],
        "entropy_target": filled_targets([r.get("entropy_target") for r in rows_t], tracked),
        "controlled": config.algo.controller is not None,
        "accuracy_first": evals[0]["pass@1"] if evals else None,
        "accuracy_after": evals[-1]["pass@1"] if evals else None,
        # (iteration, held-out accuracy) of every evaluation, first to last
        "accuracy_curve": [[e["iteration"], e["pass@1"]] for e in evals],
        "generated_tokens": sum(r.get("generated_tokens", 0) for r in rows_t),
        "wall_s": wall_s,
    }


def default_workers(n_jobs: int) -> int:
    """One job more than the cores, at most one per job. With one per core, a core idles
    while the last run finishes alone; with two per core, the longest run (the held one, whose
    probe rescoring doubles its update) gets half a core and sets the wall time. One more than
    the cores keeps every core busy and gives each run a larger share. Jobs run one thread
    each either way, so the schedule changes no number."""
    return min((os.cpu_count() or 1) + 1, n_jobs)


def plan_jobs(out: Path, runs: list[DemoRun], seeds: list[int], iterations: int, lr: float,
              eval_tasks: int, *, workers: int, engine: str | None = None,
              threads: int | None = None, model: str | None = None,
              base: bool = True) -> list[Job]:  # fmt: skip
    """Every run for every seed, then the base model's evaluation (the shortest job, so it
    fills the gap a fast-collapsing run leaves; none when ``eval_tasks`` is 0 or ``base`` is
    False). ``threads`` per job: default cores // workers."""
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    kind = engine or AGENT.engine
    jobs = []
    names = shown_names([{"label": run.label} for run in runs])
    for seed in seeds:
        for run in runs:
            config = demo_config(run.algo, out / f"seed{seed}", iterations, lr, eval_tasks,
                                 seed=seed, engine=kind, name=run.folder, threads=threads,
                                 model=model)  # fmt: skip
            jobs.append(Job(run.label, seed, threads, config, spec=run.spec, name=names[run.label]))
    if eval_tasks and base:
        jobs.append(Job("base model", seeds[0], threads, eval_tasks=eval_tasks, engine=kind,
                        model=model))  # fmt: skip
    return jobs


def announce_demo(job: Job | PassJob, result: dict[str, Any]) -> None:
    """One line per finished job: a run's entropy and wall time, a pass@k, the base model's."""
    if "pass_at_k" in result:
        print(f"pass@k, {job.label}, seed {job.seed}: {pass_line(result['pass_at_k'])}",
              flush=True)  # fmt: skip
    elif "accuracy_before" in result:
        print(f"base model: held-out accuracy {result['accuracy_before']:.3f}", flush=True)
    else:
        e = result["entropy"]
        name = getattr(job, "name", "") or job.label  # a benchmark's own jobs have no name
        print(f"{name}, seed {job.seed}: entropy {e[0]:.3f} -> {e[-1]:.3f} "
              f"({result['wall_s']:.0f} s)", flush=True)  # fmt: skip


def run_demo(
    out: Path,
    runs: list[DemoRun],
    iterations: int,
    lr: float,
    eval_tasks: int,
    *,
    seeds: list[int] | tuple[int, ...] = DEFAULT_SEEDS,
    engine: str | None = None,
    workers: int | None = None,
    pass_tasks: int = PASS_TASKS,
    pass_samples: int = PASS_SAMPLES,
    model: str | None = None,
) -> dict[str, Any]:
    """Evaluate the base model and train each run for each seed (``workers`` processes at a
    time), score pass@k of every final policy and the base model (``pass_tasks`` held-out tasks
    x ``pass_samples``; none when either is 0), plot, print the report. ``model``: None is the
    demo's SmolLM2 (tests use a tiny one). A non-empty ``out`` is refused (ValueError) so no
    earlier result is mixed in."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; remove it or pass --out NEW_DIR")
    from entrogym.models import resolve_model

    start = time.perf_counter()
    seeds = list(seeds)
    # dequantises the shipped GGUF once, before the workers start
    resolve_model(model or AGENT.model)
    pass_at = bool(pass_tasks and pass_samples)
    n_jobs = (1 if eval_tasks else 0) + len(runs) * len(seeds) + pass_at
    workers = workers or default_workers(n_jobs)
    jobs = plan_jobs(out, runs, seeds, iterations, lr, eval_tasks, workers=workers, engine=engine,
                     model=model)  # fmt: skip
    print(f"{n_jobs} jobs on {workers} worker process(es), {jobs[0].threads} thread(s) each",
          flush=True)  # fmt: skip
    kind = engine or AGENT.engine

    def pass_job(label: str, seed: int, adapter: str | None) -> PassJob:
        return PassJob(label, seed, Task(ENV, ENV_KWARGS), adapter, pass_tasks, pass_samples,
                       jobs[0].threads, kind, model)  # fmt: skip

    def then(job: Job | PassJob, result: dict[str, Any]) -> list[PassJob]:
        """A trained run's pass@k, queued the moment its training ends."""
        if not (pass_at and isinstance(job, Job) and job.config is not None):
            return []
        return [pass_job(result["label"], result["seed"], final_adapter(Path(result["folder"])))]

    # the base model's pass@k needs no training: it fills the first phase's spare worker
    first: list[Job | PassJob] = [*jobs, *([pass_job("base model", seeds[0], None)] * pass_at)]
    # the held run (the last) is the slowest, its probe rescored every iteration: it and its
    # pass@k keep the normal priority, the rest fill the other core
    held = runs[-1].label
    results = run_jobs(first, workers, run_job, announce_demo, then=then,
                       urgent=lambda job: job.label == held)  # fmt: skip
    records = [r for job, r in zip(first, results, strict=False)
               if isinstance(job, Job) and job.config is not None]  # fmt: skip
    base = [r for r in results if "accuracy_before" in r]
    base_pass = next((r["pass_at_k"] for r in results if "pass_at_k" in r), None)
    # the follow-ups' results come after the first phase's, in the trained runs' order
    if pass_at:
        for record, scored in zip(records, results[len(first) :], strict=True):
            record["pass_at_k"] = scored["pass_at_k"]
    for path in plot_demo(records, out / "plots"):
        print(path)
    settings = {"out": str(out), "runs": [run.text for run in runs], "iterations": iterations, "lr": lr,
                "eval_tasks": eval_tasks, "seeds": seeds, "engine": engine or AGENT.engine,
                "workers": workers, "threads": jobs[0].threads, "env": ENV,
                "env_kwargs": ENV_KWARGS, "pass_tasks": pass_tasks,
                "pass_samples": pass_samples}  # fmt: skip
    summary: dict[str, Any] = {"settings": settings, "runs": records}
    summary["accuracy_before"] = base[0]["accuracy_before"] if base else None
    summary["base_pass_at_k"] = base_pass
    summary["sequential"] = measured_line()
    summary["world"] = recorded_world()
    summary["wall_s"] = time.perf_counter() - start
    summary["goal"] = goal(records)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print(report(summary))
    return summary
