"""Entropy held on SmolLM2: entrogym's runs and TRL 1.16's adaptive entropy control side by side,
on the demo's workload, for each seed, with the demo's goal checked per seed.

    make entropy-hold                                   # builds .venv-bench (TRL), then runs
    nice -n 10 .venv/bin/python benchmarks/entropy_hold.py --out runs/entropy-hold \\
        --seeds 0 1 --iterations 20 --trl-delta 0.005,0.05

The workload is ``entrogym demo``'s (``entrogym.experiments``): SmolLM2-135M-Instruct in fp32,
the ``hf`` engine, one-digit ``entrogym/Arithmetic-v0``, its tasks x samples per iteration, 48
response tokens, one epoch in two minibatches, the demo's LoRA and learning rate. entrogym's
runs are demo run specs (``--runs``, default the demo's three) trained by the demo's own runner
(``entrogym.experiments.plan_jobs``, ``run_jobs``). TRL's row is ``GRPOTrainer`` with ``use_adaptive_entropy=True`` on the
same model folder, prompts (in the order the trainer draws them), K, token budget, LoRA, lr,
clip and batching (``trl_entropy.py`` in ``.venv-bench``, as ``iteration.py`` runs TRL), with
``entropy_target`` set to its first iteration's logged entropy and one row per
``--trl-delta`` (its ``entropy_coef_delta``; TRL's default 0.005). TRL's adapters, after the
first and the last iteration's update, are scored by entrogym's own evaluation
(``entrogym.experiments.held_out_accuracy``: the same 40 test tasks, seed and sampling as the
demo's eval rows), so both sides are measured by one grader. ``tracking_error`` and
``max_excursion`` of every row come from the demo's ``tracking`` and the verdict from its
``goal``.

What "entropy" means on each side (docs/demo.md, "Comparing with TRL's adaptive entropy"):

- entrogym's ``entropy`` (``entrogym.algos.update.policy_update``): the sampled estimate
  mean_t -log pi(a_t|s_t) over every completion token of the iteration's batch, from the
  trainer's fp32 scores under the policy that sampled it, before any of that iteration's
  updates, at temperature 1 (the demo samples at 1). Its controller sees this value.
- TRL's ``entropy`` (``GRPOTrainer._compute_loss``): the full-distribution entropy
  -sum_v p log p at each completion position, from the training forward at the sampling
  temperature (1 here), averaged over the completion tokens of each micro-batch, then over the
  logging window's micro-batches (``logging_steps`` = the two optimizer steps of an iteration,
  so one value per iteration). The second minibatch's micro-batches run after the first
  optimizer step, so half of it is measured after one update. Its controller uses the same
  per-token entropy, token-weighted over each optimizer step's window (``_last_world_entropy``).

Both estimate the same quantity (the mean per-token entropy of the policy over completion
tokens; -log pi of a sampled token has the full entropy as its expectation), at the same
temperature. What cannot be made identical: the estimator (sampled vs exact, so entrogym's has
sampling noise), the moment (entrogym's before the iteration's update, TRL's half after the
first step), TRL's first iteration (its target is unknown until that iteration is logged, so
it runs with TRL's default target 0.2 nats, under which the coefficient stays at its start,
0), the LoRA initialisation and sampling RNG (two frameworks, two random streams), and TRL's
``hf`` generate inside its own trainer against entrogym's engine.

Prints one JSON document on stdout (progress and the demo's table go to stderr) and, with
``--out``, writes ``OUT/entropy_hold.json`` beside the run folders.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iteration import BENCH_PYTHON, HERE, bench_env_problem, build_workload, run_worker

from entrogym.commands.demo_runs import parse_run
from entrogym.experiments import (
    AGENT,
    DEFAULT_LR,
    DEFAULT_RUNS,
    ENV,
    ENV_KWARGS,
    SAMPLES,
    TASKS,
    announce_demo,
    goal,
    held_out_accuracy,
    plan_jobs,
    report,
    run_job,
    run_jobs,
    tracking,
    verdict,
)

TRL_DEFAULT_DELTA = 0.005


@dataclass(frozen=True)
class TrlJob:
    """One TRL run with adaptive entropy: its workload file, delta, folder and grader."""

    label: str
    seed: int
    threads: int
    delta: float
    workload: str
    folder: str
    eval_tasks: int
    model: str | None = None
    timeout: float = 7200.0


def run_trl_job(job: TrlJob) -> dict[str, Any]:
    """TRL's run in ``.venv-bench``, then its two adapters scored by entrogym's evaluation; a
    record in the shape of ``entrogym.experiments.train_one``'s."""
    from entrogym.train.devices.precision import apply_threads

    start = time.perf_counter()
    folder = Path(job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [str(BENCH_PYTHON), str(HERE / "trl_entropy.py"), job.workload,
           str(folder / "result.json"), "--delta", repr(job.delta), "--out", str(folder)]  # fmt: skip
    try:
        out = run_worker(cmd, folder / "result.json", job.timeout)
    except SystemExit as err:  # a pool worker must raise an Exception, not exit
        raise RuntimeError(str(err)) from None
    apply_threads(job.threads)
    first, last = (held_out_accuracy("hf", job.eval_tasks, job.seed, adapter=out[key],
                                     model=job.model)
                   for key in ("adapter_first", "adapter_last"))  # fmt: skip
    entropy = out["entropy"]
    return {
        "label": job.label,
        "seed": job.seed,
        "algo": "trl",
        "folder": str(folder),
        "entropy": entropy,
        "entropy_ratio": entropy[-1] / entropy[0],
        "reward": out["reward"],
        "zeta": out["entropy_coef"],
        "entropy_target": [out["entropy_target"]] * len(entropy),
        "controlled": True,
        "accuracy_first": first,
        "accuracy_after": last,
        "generated_tokens": out["generated_tokens"],
        "wall_s": time.perf_counter() - start,  # training and the two evaluations, as entrogym's
        "peak_rss_mb": out["peak_rss_mb"],
        "trl": out["trl"],
    }


def run_any(job: Any) -> dict[str, Any]:
    """The pool's job body: a TRL run or one of the demo's jobs."""
    return run_trl_job(job) if isinstance(job, TrlJob) else run_job(job)


def row(record: dict[str, Any]) -> dict[str, Any]:
    """One run's JSON row; tracking_error / max_excursion by the demo's own ``tracking``."""
    return {
        "label": record["label"],
        "framework": "trl" if record["algo"] == "trl" else "entrogym",
        "seed": record["seed"],
        "entropy": record["entropy"],
        "entropy_target": record["entropy_target"],
        **tracking(record),
        "reward": record["reward"],
        "coefficient": record.get("zeta"),
        "accuracy": {"first": record["accuracy_first"], "last": record["accuracy_after"]},
        "wall_s": record["wall_s"],
        "tokens_generated": record["generated_tokens"],
    }


def summarize(records: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's JSON: settings, one row per run, and the demo's goal per seed."""
    result = goal(records)
    per_seed: dict[str, dict[str, Any]] = {str(s): {} for s in sorted({r["seed"] for r in records})}
    for check in result["checks"]:
        per_seed[str(check["seed"])][check["run"]] = {
            k: v for k, v in check.items() if k not in ("run", "seed")
        }
    return {
        "settings": settings,
        "runs": [row(r) for r in records],
        "verdict": per_seed,
        "goal": {k: result[k] for k in ("band", "fall", "accuracy_slack", "first_tracked", "held")},
        "verdict_lines": verdict(result),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--lr", type=float, default=DEFAULT_LR, help="both sides' AdamW lr")
    p.add_argument("--runs", action="append", default=None,
                   help="an entrogym run as the demo spells it (repeatable; default: the "
                   f"demo's {', '.join(repr(r) for r in DEFAULT_RUNS)})")  # fmt: skip
    p.add_argument("--trl-delta", default=str(TRL_DEFAULT_DELTA),
                   help="TRL's entropy_coef_delta, one TRL run per comma-separated value")  # fmt: skip
    p.add_argument("--no-trl", action="store_true", help="entrogym's runs only")
    p.add_argument("--out", default=None, help="new or empty folder: run folders and the JSON")
    p.add_argument("--workers", type=int, default=None,
                   help="jobs side by side (default: two per core, at most one per job)")  # fmt: skip
    p.add_argument("--threads", type=int, default=None, help="torch threads per job (default 1)")
    p.add_argument("--eval-tasks", type=int, default=40, help="held-out test tasks (the demo's)")
    p.add_argument("--model", default=AGENT.model, help="(tests use tiny-random-llama)")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds per TRL process")
    args = p.parse_args(argv)
    args.runs = args.runs or list(DEFAULT_RUNS)
    return args


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with ``args`` (one line), or None; nothing loads a model."""
    for spec in args.runs:
        try:
            parse_run(spec)
        except ValueError as err:
            return f"--runs {spec!r}: {err}"
    try:
        args.deltas = [float(d) for d in args.trl_delta.split(",") if d.strip()]
    except ValueError:
        return f"--trl-delta {args.trl_delta!r}: give numbers separated by commas, e.g. 0.005,0.05"
    cores = os.cpu_count() or 1
    problems = [
        (not args.deltas or min(args.deltas) <= 0, "--trl-delta: every delta must be > 0"),
        (len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0,
         f"--seeds: give distinct seeds >= 0, got {args.seeds}"),
        (args.iterations < 1, f"--iterations must be >= 1, got {args.iterations}"),
        (not args.lr > 0, f"--lr must be > 0, got {args.lr}"),
        (args.eval_tasks < 1, f"--eval-tasks must be >= 1, got {args.eval_tasks}"),
        (args.workers is not None and not 1 <= args.workers <= 2 * cores,
         f"--workers must be from 1 to {2 * cores}, got {args.workers}"),
        (args.threads is not None and not 1 <= args.threads <= cores,
         f"--threads must be from 1 to {cores}, got {args.threads}"),
    ]  # fmt: skip
    if message := next((m for bad, m in problems if bad), None):
        return message
    if args.out and Path(args.out).exists() and any(Path(args.out).iterdir()):
        return f"--out {args.out} is not empty; remove it or pass --out NEW_DIR"
    if not args.no_trl and (problem := bench_env_problem()):
        return f"TRL's environment is missing ({problem}); build it with: make entropy-hold, or pass --no-trl"
    return None


def plan(args: argparse.Namespace, out: Path, workers: int, threads: int) -> list[Any]:
    """TRL's runs first (the slowest jobs), then entrogym's (the demo's ``plan_jobs``)."""
    jobs: list[Any] = []
    for seed in [] if args.no_trl else args.seeds:
        ns = argparse.Namespace(model=args.model, tasks=TASKS, samples=SAMPLES, natural_lengths=True,
                                iterations=args.iterations, seed=seed, device="cpu",
                                dtype="fp32", threads=threads)  # fmt: skip
        work = build_workload(ns)  # the demo's tasks, in the order its trainer draws them
        work.settings["lr"] = args.lr
        path = out / "trl" / f"seed{seed}" / "workload.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        work.save(path)
        for delta in args.deltas:
            label = f"trl adaptive-entropy delta {delta:g}"
            jobs.append(TrlJob(label, seed, threads, delta, str(path),
                               str(path.parent / f"delta{delta:g}"), args.eval_tasks,
                               model=args.model, timeout=args.timeout))  # fmt: skip
    runs = [parse_run(spec) for spec in args.runs]
    return jobs + plan_jobs(out, runs, args.seeds, args.iterations, args.lr,
                            args.eval_tasks, workers=workers, threads=threads,
                            model=args.model, base=False)  # fmt: skip


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Progress (ours and every child's) to stderr, so stdout stays one JSON document."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what replaced sys.stdout (pytest's capture)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if problem := check_args(args):
        print(f"entropy_hold: {problem}", file=sys.stderr)
        return 2
    from entrogym.models import resolve_model

    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if args.out:
            out = Path(args.out)
        else:
            out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="entropy-hold-")))
        n_jobs = len(args.seeds) * (len(args.runs) + (0 if args.no_trl else len(args.deltas)))
        workers = args.workers or min(2 * (os.cpu_count() or 1), n_jobs)
        threads = args.threads or 1
        with stdout_to_stderr():
            resolve_model(args.model)  # dequantises the shipped GGUF once, before the workers
            jobs = plan(args, out, workers, threads)
            print(f"{len(jobs)} jobs on {workers} worker process(es), {threads} thread(s) each")
            records = run_jobs(jobs, workers, run_any, announce_demo)
        settings = {
            "model": args.model, "engine": "hf", "dtype": "fp32", "env": ENV,
            "env_kwargs": ENV_KWARGS, "tasks": TASKS, "samples": SAMPLES, "max_response_tokens": 48,
            "epochs": 1, "minibatches": 2, "lr": args.lr, "iterations": args.iterations,
            "seeds": args.seeds, "eval_tasks": args.eval_tasks, "runs": args.runs,
            "trl_deltas": [] if args.no_trl else args.deltas, "workers": workers,
            "threads": threads, "out": args.out, "wall_s": time.perf_counter() - start,
            "load_avg_end": os.getloadavg()[0],
            "trl": next((r["trl"] for r in records if "trl" in r), None),
        }  # fmt: skip
        result = summarize(records, settings)
        table = {"settings": settings, "runs": records, "wall_s": settings["wall_s"]}
        print(report(table), file=sys.stderr)
        text = json.dumps(result, indent=1)
        if args.out:
            (out / "entropy_hold.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
