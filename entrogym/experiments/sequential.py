"""The sequential experiment (``entrogym sequential``, ``make sequential``): does a policy that
kept its entropy on a first task learn a second task better than one that collapsed?

Stage 1 trains each run (GRPO, the paper's REPO-R, the held configuration) on task A with the
demo's settings. Each final adapter, and the base model, is scored on A's held-out tasks with
many samples (pass@k). Stage 2 continues every stage-1 adapter on task B with one and the same
algorithm (``--init-adapter``), so that only the starting policy differs, and records B's
reward per iteration and B's held-out accuracy after its first and last update.

This is the paper's sequential experiment (AIME, then AppWorld; Sec. 6) at a 135M model's
scale. The task pairs are in :data:`PAIRS`; docs/sequential.md says how they were chosen.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from entrogym.atomic import atomic_write_text
from entrogym.experiments.config import AGENT, DEFAULT_LR, DEFAULT_RUNS, DemoRun, demo_config
from entrogym.experiments.pass_at_k import PassJob, Task, final_adapter, pass_at_k_of, pass_line
from entrogym.experiments.pool import run_jobs
from entrogym.experiments.run import run_record, train_one

__all__ = ["PAIRS", "Plan", "Task", "TaskPair", "late_accuracy", "run_sequential"]


@dataclass(frozen=True)
class TaskPair:
    """Task A (stage 1) and task B (stage 2), with why they were paired."""

    a: Task
    b: Task
    why: str


ARITHMETIC = "entrogym/Arithmetic-v0"
# one-digit + and -, the demo's task: task A of the first pairs
ADD1 = Task(ARITHMETIC, {"max_digits": 1, "num_train": 100, "num_test": 40})
# one-digit + and - with negative answers: task A of the later pairs
NEG1 = Task(ARITHMETIC, {"max_digits": 1, "allow_negative": True, "num_train": 100, "num_test": 40})
PAIRS: dict[str, TaskPair] = {
    "add1-add2": TaskPair(
        a=ADD1,
        b=Task(ARITHMETIC, {"max_digits": 2, "num_train": 200, "num_test": 40}),
        why="one-digit + and - (the demo's task), then operands of one or two digits",
    ),
    # B in the 20-60 % band asked of a second task (base pass@1 0.23, docs/results.md)
    "add1-mixed": TaskPair(
        a=ADD1,
        b=Task(
            ARITHMETIC, {"max_digits": 1, "operations": "+-*", "num_train": 100, "num_test": 40}
        ),
        why="one-digit + and - (the demo's task), then one-digit +, - and * (* is new)",
    ),
    # a single operator to collapse onto, then another; B's base pass@1 0.24, in the 20-60 %
    # band. The highest mean stage-2 lead on seeds 0-2, reversed on seeds 3-5 (docs/results.md,
    # 2026-11-28 14:55 and 2026-11-29 16:16)
    "add-mul": TaskPair(
        a=Task(ARITHMETIC, {"max_digits": 1, "operations": "+", "num_train": 40, "num_test": 20}),
        b=Task(ARITHMETIC, {"max_digits": 1, "operations": "*", "num_train": 40, "num_test": 20}),
        why="one-digit + alone, then one-digit * (another operation on the same operands)",
    ),
    # A that a collapse leaves partly unsolved (base pass@1 0.22; GRPO ends with a quarter of
    # it out of reach in 32 samples), then a B that a screen of the stage-1 policies picked:
    # the held starts reach more of it (docs/results.md, 2026-11-29 10:03 and 10:30)
    "neg-mixed": TaskPair(
        a=NEG1,
        b=Task(
            ARITHMETIC, {"max_digits": 1, "operations": "+-*", "num_train": 100, "num_test": 40}
        ),
        why="one-digit + and - with negative answers, then one-digit +, - and *",
    ),
    # a B from another domain, so that A's arithmetic carries less and the starting policy's
    # exploration more: reasoning-gym's gcd scaled to a 135M model and graded by the last
    # number (base pass@1 0.16, pass@8 0.63: most tasks within reach of sampling, few of the
    # first sample; docs/results.md, 2026-12-02 01:58)
    "neg-gcd": TaskPair(
        a=NEG1,
        b=Task(
            "entrogym/ReasoningGym-v0",
            {
                "dataset": "gcd",
                "config": {"max_value": 10},
                "size": 100,
                "test_size": 40,
                "seed": 0,
                "bare_number": True,
            },
        ),
        why="one-digit + and - with negative answers, then the gcd of two numbers up to 10",
    ),
    # a task switch: |a - b| after signed a - b, where the sign A taught is wrong on 45 of 100
    # pairs (base pass@1 0.13, pass@8 0.58; docs/results.md, 2026-12-05 00:37 and 01:40)
    "neg-abs": TaskPair(
        a=NEG1,
        b=Task(
            ARITHMETIC,
            {
                "max_digits": 1,
                "operations": "-",
                "allow_negative": True,
                "absolute": True,
                "num_train": 60,
                "num_test": 40,
            },
        ),
        why="one-digit + and - with negative answers, then |a - b| of one-digit operands",
    ),
}
DEFAULT_PAIR = "add1-add2"
STAGE1_ITERATIONS, STAGE2_ITERATIONS = 15, 10
# Stage 2's one algorithm: plain GRPO, so that only the starting policy differs (a run's text,
# read like stage 1's).
STAGE2_ALGO = "grpo"
# Stage 1's runs: GRPO, the paper's REPO-R preset, and the held configuration (the demo's).
RUNS = DEFAULT_RUNS
# pass@k on A: the first PASS_TASKS held-out tasks, PASS_SAMPLES samples each.
PASS_TASKS, PASS_SAMPLES = 16, 64


def stage_area(reward: list[float]) -> float:
    """The area under a stage-2 reward curve, per iteration: the trapezoid rule over iterations
    0..n-1 divided by n - 1 (the mean height; a single iteration is its own reward)."""
    if len(reward) == 1:
        return float(reward[0])
    inner = sum(reward[1:-1]) + (reward[0] + reward[-1]) / 2
    return inner / (len(reward) - 1)


def late_accuracy(curve: list[list[float]], iterations: int) -> float | None:
    """The mean held-out accuracy over a stage's second half: the evaluations after iterations
    ``(iterations - 1) / 2`` and on (``curve``: [iteration, accuracy] pairs, 0-based). Where a
    run ends, with less noise than its last evaluation when it is evaluated often
    (``--stage2-eval-every``): between iterations 20 and 30 one policy's held-out accuracy
    moved by up to +-0.12, more than the effect measured (docs/results.md). With only the
    first and last evaluations it is the last; None without evaluations."""
    late = [accuracy for it, accuracy in curve if 2 * it >= iterations - 1]
    return sum(late) / len(late) if late else None


@dataclass(frozen=True)
class TrainJob:
    """Train one run of one stage (``config`` is a TrainConfig)."""

    label: str
    seed: int
    stage: int
    config: Any


def run_sequential_job(job: TrainJob | PassJob) -> dict[str, Any]:
    """Body of one pool process."""
    if isinstance(job, PassJob):
        return {"label": job.label, "seed": job.seed, "pass_at_k": pass_at_k_of(job)}
    from entrogym.experiments.log_labels import labelled_output

    name = f"{job.label} s{job.seed} stage{job.stage}"
    with labelled_output(name, job.config.algo.name):
        record = train_one(job.config)
    return {"label": job.label, "seed": job.seed, "stage": job.stage, **record}


def announce(job: TrainJob | PassJob, result: dict[str, Any]) -> None:
    """One line per finished job."""
    if isinstance(job, PassJob):
        print(f"pass@k on A, {job.label}, seed {job.seed}: {pass_line(result['pass_at_k'])}",
              flush=True)  # fmt: skip
        return
    reward, entropy = result["reward"], result["entropy"]
    print(f"stage {job.stage}, {job.label}, seed {job.seed}: entropy {entropy[0]:.3f} -> "
          f"{entropy[-1]:.3f}, reward {reward[0]:.3f} -> {reward[-1]:.3f} "
          f"({result['wall_s']:.0f} s)", flush=True)  # fmt: skip


def _run_folder(root: Path, *names: str) -> Path:
    """A stage-1 run's folder under ``root``: the first of ``names`` that holds a run."""
    for name in dict.fromkeys(names):
        if (root / name / "metrics.jsonl").is_file():
            return root / name
    raise ValueError(f"stage1_from: no finished run {names[0]!r} under {root}")


def _train_rows(folder: Path) -> list[dict[str, Any]]:
    from entrogym.train.folder.metrics import read_metrics

    return [r for r in read_metrics(folder) if r.get("kind", "train") == "train"]


@dataclass
class Plan:
    """Everything one ``entrogym sequential`` run does (settled before any model loads)."""

    out: Path
    pair_name: str
    pair: TaskPair
    runs: list[DemoRun]  # stage 1's; the last is the held run
    stage2_algo: DemoRun
    seeds: list[int] = field(default_factory=lambda: [0])
    stage1_iterations: int = STAGE1_ITERATIONS
    stage2_iterations: int = STAGE2_ITERATIONS
    lr: float = DEFAULT_LR
    eval_tasks: int = 40
    eval_samples: int = 1
    # stage 2's held-out evaluations every this many iterations as well (0: after the first
    # and the last update only)
    stage2_eval_every: int = 0
    pass_tasks: int = PASS_TASKS
    pass_samples: int = PASS_SAMPLES
    workers: int = 4
    threads: int = 1
    engine: str = AGENT.engine
    model: str | None = None  # None: the demo's model (tests use a tiny one)
    # a finished stage 1 to continue from (its out, or a demo's: FOLDER/seedS/RUN) instead of
    # training stage 1 again
    stage1_from: Path | None = None

    def stage1_jobs(self) -> list[TrainJob]:
        pair = self.pair
        jobs = []
        for seed in self.seeds:
            for run in self.runs:
                config = demo_config(run.algo, self.out / "stage1" / f"seed{seed}",
                                     self.stage1_iterations, self.lr, self.eval_tasks, seed=seed,
                                     engine=self.engine, name=run.folder, threads=self.threads,
                                     model=self.model, env=pair.a.env,
                                     env_kwargs=pair.a.env_kwargs,
                                     eval_samples=self.eval_samples)  # fmt: skip
                jobs.append(TrainJob(run.label, seed, 1, config))
        return jobs

    def reused_stage1(self) -> list[dict[str, Any]]:
        """Stage 1's records read from the finished runs under ``stage1_from`` (their last
        checkpoint must be the run's last iteration)."""
        assert self.stage1_from is not None
        records = []
        runs = [run for _ in self.seeds for run in self.runs]
        for job, run in zip(self.stage1_jobs(), runs, strict=True):
            config, seed = job.config, job.seed
            # a sequential run's out holds stage1/seedS/RUN, a demo's seedS/RUN
            nested = (self.stage1_from / "stage1").is_dir()
            root = self.stage1_from / ("stage1" if nested else ".") / f"seed{seed}"
            folder = _run_folder(root, Path(config.out).name, run.spec_folder)
            last = Path(final_adapter(folder)).parent.name
            if last != f"iter-{self.stage1_iterations - 1:06d}":
                raise ValueError(f"stage1_from: {folder} ends at {last}, not at iteration "
                                 f"{self.stage1_iterations - 1}; pass its --stage1-iterations")  # fmt: skip
            wall = sum(r.get("iteration_s", 0.0) for r in _train_rows(folder))
            records.append({"label": job.label, "seed": seed, "stage": 1,
                            **run_record(config, folder, wall)})  # fmt: skip
        return records

    def reused_passes(self) -> list[dict[str, Any]]:
        """pass@k on A from ``stage1_from``'s own ``summary.json``, when it scored the same task
        with the same tasks, samples, engine and model (pass@k does not depend on task B);
        else none, and they are scored again."""
        summary_file = self.stage1_from / "summary.json" if self.stage1_from else None
        if summary_file is None or not summary_file.is_file():
            return []
        done = json.loads(summary_file.read_text())
        if "pair" not in done:  # an `entrogym demo` out: its pass@k is not kept per run
            return []
        same = ("pass_tasks", "pass_samples", "engine", "model")
        if done["pair"]["a"] != asdict(self.pair.a) or any(
            done["settings"].get(k) != getattr(self, k) for k in same
        ):
            return []
        passes = [{"label": r["label"], "seed": r["seed"], "pass_at_k": r["stage1"]["pass_at_k"]}
                  for r in done["runs"]]  # fmt: skip
        if done["base"]["pass_at_k"] is not None and self.seeds[0] in done["settings"]["seeds"]:
            passes.append({"label": "base model", "seed": self.seeds[0],
                           "pass_at_k": done["base"]["pass_at_k"]})  # fmt: skip
        return passes

    def pass_job(self, label: str, seed: int, adapter: str | None) -> PassJob:
        return PassJob(label, seed, self.pair.a, adapter, self.pass_tasks,
                       self.pass_samples, self.threads, self.engine, self.model)  # fmt: skip

    def stage2_job(self, stage1: dict[str, Any]) -> TrainJob:
        pair, seed = self.pair, stage1["seed"]
        stage2, folder = self.stage2_algo, Path(stage1["folder"])
        config = demo_config(stage2.algo, self.out / "stage2" / f"seed{seed}",
                             self.stage2_iterations, self.lr, self.eval_tasks, seed=seed,
                             engine=self.engine, name=f"{folder.name}-then-{stage2.spec_folder}",
                             threads=self.threads,
                             model=self.model, env=pair.b.env, env_kwargs=pair.b.env_kwargs,
                             init_adapter=final_adapter(folder),
                             eval_samples=self.eval_samples,
                             eval_every=self.stage2_eval_every or None)  # fmt: skip
        return TrainJob(stage1["label"], seed, 2, config)


def run_sequential(plan: Plan) -> dict[str, Any]:
    """Stage 1; each stage-1 run, the moment it ends, continues on B (stage 2) beside its
    pass@k on A. Writes ``summary.json`` and the plots under ``plan.out`` and prints the
    report. A non-empty ``out`` is refused."""
    if plan.out.exists() and any(plan.out.iterdir()):
        raise ValueError(f"{plan.out} is not empty; remove it or pass --out NEW_DIR")
    from entrogym.models import resolve_model

    start = time.perf_counter()
    resolve_model(plan.model or AGENT.model)  # dequantise the GGUF once, before the workers
    reused = plan.reused_passes()
    scored = {(r["label"], r["seed"]) for r in reused}
    base_pass = [] if ("base model", plan.seeds[0]) in scored else [
        plan.pass_job("base model", plan.seeds[0], None)]  # fmt: skip

    def follow_ups(job: Any, record: dict[str, Any]) -> list[TrainJob | PassJob]:
        """A finished stage-1 run's stage 2 on B, and its pass@k on A unless reused."""
        if not (isinstance(job, TrainJob) and job.stage == 1):
            return []
        jobs: list[TrainJob | PassJob] = [plan.stage2_job(record)]
        if (record["label"], record["seed"]) not in scored:
            jobs.append(plan.pass_job(record["label"], record["seed"],
                                      final_adapter(Path(record["folder"]))))  # fmt: skip
        return jobs

    where = f", reused from {plan.stage1_from}" if plan.stage1_from else ""
    print(f"stage 1: {len(plan.runs)} run(s) x {len(plan.seeds)} seed(s) on task A "
          f"({plan.stage1_iterations} iterations){where}; each then continues on task B "
          f"({plan.stage2_iterations} iterations) beside its pass@k on A"
          + (f" ({len(reused)} reused from {plan.stage1_from})" if reused else ""),
          flush=True)  # fmt: skip
    if plan.stage1_from is None:
        # each stage-1 run's follow-ups start as soon as it ends
        first = [*plan.stage1_jobs(), *base_pass]
        results = run_jobs(first, plan.workers, run_sequential_job, announce, then=follow_ups)
        stage1 = [r for r in results if r.get("stage") == 1]
    else:
        stage1 = plan.reused_stage1()
        jobs = [job for r, record in zip(plan.stage1_jobs(), stage1, strict=True)
                for job in follow_ups(r, record)]  # fmt: skip
        results = run_jobs(jobs + base_pass, plan.workers, run_sequential_job, announce)
    results = reused + results
    summary = summarize(plan, stage1, results, time.perf_counter() - start)
    plan.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plan.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    from entrogym.experiments.sequential_report import plot_sequential, report

    for path in plot_sequential(summary, plan.out / "plots"):
        print(path)
    print(report(summary))
    return summary


def summarize(
    plan: Plan, stage1: list[dict[str, Any]], results: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """``summary.json``: per run and seed, its stage-1 entropy, target, largest excursion,
    accuracy and pass@k on A, and its stage-2 reward curve, accuracy and area on B."""
    from entrogym.experiments.report import tracking
    from entrogym.train.evaluation.target_tracking import filled_targets

    stage2 = {(r["label"], r["seed"]): r for r in results if r.get("stage") == 2}
    passes = {(r["label"], r["seed"]): r["pass_at_k"] for r in results if "pass_at_k" in r}
    runs = []
    for one in stage1:
        key, two = (one["label"], one["seed"]), stage2[(one["label"], one["seed"])]
        target = filled_targets(one["entropy_target"], one["entropy_tracked"])
        runs.append({
            "label": one["label"],
            "seed": one["seed"],
            "stage1": {
                # the entropy the controller tracked, in its target's terms (the plot's band)
                "entropy": one["entropy_tracked"],
                "entropy_sampled": one["entropy"],
                "entropy_target": target,
                "controlled": one["controlled"],
                "max_excursion": tracking(one)["max_excursion"],
                "reward": one["reward"],
                "accuracy": one["accuracy_after"],
                "pass_at_k": passes[key],
                "folder": one["folder"],
            },
            "stage2": {
                "reward": two["reward"],
                "entropy": two["entropy"],
                "accuracy_first": two["accuracy_first"],
                "accuracy": two["accuracy_after"],
                "accuracy_curve": two["accuracy_curve"],
                "accuracy_late": late_accuracy(two["accuracy_curve"], plan.stage2_iterations),
                "area": stage_area(two["reward"]),
                "folder": two["folder"],
            },
            "wall_s": one["wall_s"] + two["wall_s"],
        })  # fmt: skip
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(plan).items()
                if k not in ("pair", "pair_name")}  # fmt: skip
    settings |= {"runs": [run.text for run in plan.runs], "stage2_algo": plan.stage2_algo.text}
    pair = plan.pair
    return {
        "held": plan.runs[-1].label,
        "pair": {"name": plan.pair_name, "a": asdict(pair.a), "b": asdict(pair.b), "why": pair.why},
        "settings": settings,
        "base": {"pass_at_k": passes.get(("base model", plan.seeds[0]))},
        "runs": runs,
        "wall_s": wall_s,
        # the day it finished: the demo's report shows the newest recorded result
        "date": time.strftime("%Y-%m-%d"),
    }
