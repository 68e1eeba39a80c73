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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from entrogym.atomic import atomic_write_text
from entrogym.experiments.config import AGENT, DEFAULT_LR, DEFAULT_RUNS, DemoRun, demo_config
from entrogym.experiments.pass_at_k import PassJob, Task, final_adapter, pass_at_k_of, pass_line
from entrogym.experiments.pool import run_jobs
from entrogym.experiments.run import run_record, train_one
from entrogym.experiments.sequential_pairs import DEFAULT_PAIR, PAIRS, TaskPair
from entrogym.experiments.sequential_summary import late_accuracy, stage_area, summarize

__all__ = [
    "DEFAULT_PAIR",
    "PAIRS",
    "Plan",
    "Task",
    "TaskPair",
    "late_accuracy",
    "run_sequential",
    "stage_area",
    "summarize",
]


STAGE1_ITERATIONS, STAGE2_ITERATIONS = 15, 10
# Stage 2's one algorithm: plain GRPO, so that only the starting policy differs (a run's text,
# read like stage 1's).
STAGE2_ALGO = "grpo"
# Stage 1's runs: GRPO, the paper's REPO-R preset, and the held configuration (the demo's).
RUNS = DEFAULT_RUNS
# pass@k on A: the first PASS_TASKS held-out tasks, PASS_SAMPLES samples each.
PASS_TASKS, PASS_SAMPLES = 16, 64


@dataclass(frozen=True)
class TrainJob:
    """Train one run of one stage (``config`` is a TrainConfig)."""

    label: str
    seed: int
    stage: int
    config: Any


def run_sequential_job(job: TrainJob | PassJob) -> dict[str, Any]:
    """Body of one pool process. A run whose folder holds a checkpoint already (an experiment
    stopped and resumed) continues from it."""
    if isinstance(job, PassJob):
        return {"label": job.label, "seed": job.seed, "pass_at_k": pass_at_k_of(job)}
    from entrogym.experiments.log_labels import labelled_output
    from entrogym.train.folder.layout import has_checkpoint

    config = job.config
    if has_checkpoint(Path(config.out)):  # its start is in the checkpoint, not init_adapter
        config = replace(config, resume=True, init_adapter=None)
    name = f"{job.label} s{job.seed} stage{job.stage}"
    with labelled_output(name, config.algo.name):
        record = train_one(config)
    return {"label": job.label, "seed": job.seed, "stage": job.stage, **record}


def job_key(job: TrainJob | PassJob) -> str:
    """A job's name in the journal (``entrogym.experiments.journal``)."""
    if isinstance(job, PassJob):
        return f"pass/{job.label}/seed{job.seed}"
    return f"stage{job.stage}/{job.label}/seed{job.seed}"


def held_out_size(task: Task) -> int:
    """Tasks in ``task``'s held-out split."""
    from entrogym.envs.base import make_text_env, task_ids_of

    env = make_text_env(task.env, **task.env_kwargs)
    try:
        return len(task_ids_of(env, task.held_out))
    finally:
        env.close()


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
    # continue a stopped experiment in ``out`` from its finished jobs (entrogym.experiments.journal)
    resume: bool = False

    def stage1_folders(self) -> list[tuple[TrainJob, Path]]:
        """Each stage-1 job and the finished run under ``stage1_from`` it reuses, checked to
        be that run (:func:`~entrogym.experiments.stage1_reuse.stage1_mismatch`: task A and its
        kwargs, the spec, the model, lr, the iterations and the seed) and to end at its last
        iteration; ValueError (one line) otherwise."""
        from entrogym.experiments.stage1_reuse import stage1_mismatch

        assert self.stage1_from is not None
        out = []
        runs = [run for _ in self.seeds for run in self.runs]
        for job, run in zip(self.stage1_jobs(), runs, strict=True):
            # a sequential run's out holds stage1/seedS/RUN, a demo's seedS/RUN
            nested = (self.stage1_from / "stage1").is_dir()
            root = self.stage1_from / ("stage1" if nested else ".") / f"seed{job.seed}"
            folder = _run_folder(root, Path(job.config.out).name, run.spec_folder)
            differ = stage1_mismatch(folder, job.config.to_dict())
            if differ:
                raise ValueError(
                    f"stage1_from: {folder} is not this experiment's stage-1 run {job.label!r} "
                    f"(seed {job.seed}): {differ}; pass the options it was trained with "
                    "(--task-a, --runs, --model, --lr, --stage1-iterations, --seeds), or "
                    "train stage 1 again without --stage1-from"
                )
            last = Path(final_adapter(folder)).parent.name
            if last != f"iter-{self.stage1_iterations - 1:06d}":
                raise ValueError(f"stage1_from: {folder} ends at {last}, not at iteration "
                                 f"{self.stage1_iterations - 1}; pass its --stage1-iterations")  # fmt: skip
            out.append((job, folder))
        return out

    def tasks_used(self) -> dict[str, int]:
        """The held-out task counts the runs use: ``eval_tasks`` and ``pass_tasks`` capped at
        the size of each task's held-out split."""
        a, b = held_out_size(self.pair.a), held_out_size(self.pair.b)
        return {
            "eval_tasks_a": min(self.eval_tasks, a),
            "eval_tasks_b": min(self.eval_tasks, b),
            "pass_tasks_a": min(self.pass_tasks, a),
        }

    def record(self) -> dict[str, Any]:
        """The experiment as plain data (``plan.json``; the summary's ``pair`` and
        ``settings``)."""
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self).items()
                    if k not in ("pair", "pair_name")}  # fmt: skip
        settings |= {"runs": [run.text for run in self.runs],
                     "stage2_algo": self.stage2_algo.text}  # fmt: skip
        pair = self.pair
        return {
            "pair": {
                "name": self.pair_name,
                "a": asdict(pair.a),
                "b": asdict(pair.b),
                "why": pair.why,
            },  # fmt: skip
            "settings": settings,
        }

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
                                     eval_split=pair.a.held_out, settings=pair.a.settings,
                                     eval_samples=self.eval_samples)  # fmt: skip
                jobs.append(TrainJob(run.label, seed, 1, config))
        return jobs

    def reused_stage1(self) -> list[dict[str, Any]]:
        """Stage 1's records read from the finished runs under ``stage1_from`` (their last
        checkpoint must be the run's last iteration)."""
        records = []
        for job, folder in self.stage1_folders():
            wall = sum(r.get("iteration_s", 0.0) for r in _train_rows(folder))
            records.append({"label": job.label, "seed": job.seed, "stage": 1,
                            **run_record(job.config, folder, wall)})  # fmt: skip
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
                             eval_split=pair.b.held_out, settings=pair.b.settings,
                             init_adapter=final_adapter(folder),
                             eval_samples=self.eval_samples,
                             eval_every=self.stage2_eval_every or None)  # fmt: skip
        return TrainJob(stage1["label"], seed, 2, config)


def run_sequential(plan: Plan) -> dict[str, Any]:
    """Stage 1; each stage-1 run, the moment it ends, continues on B (stage 2) beside its
    pass@k on A. Writes ``summary.json`` and the plots under ``plan.out`` and prints the
    report. A non-empty ``out`` is refused, unless ``plan.resume`` continues its experiment:
    the jobs its journal lists as finished are not run again (``entrogym.experiments.journal``)."""
    from entrogym.experiments.journal import JobJournal, open_experiment
    from entrogym.models import resolve_model

    open_experiment(plan.out, plan.record(), plan.resume)
    journal = JobJournal(plan.out)
    start = time.perf_counter()
    resolve_model(plan.model or AGENT.model)  # dequantise the GGUF once, before the workers

    def finished(job: Any) -> dict[str, Any] | None:
        return journal.get(job_key(job))

    def announce_and_keep(job: Any, result: dict[str, Any]) -> None:
        announce(job, result)
        journal.add(job_key(job), result)

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
        results = run_jobs(first, plan.workers, run_sequential_job, announce_and_keep,
                           then=follow_ups, known=finished)  # fmt: skip
        stage1 = [r for r in results if r.get("stage") == 1]
    else:
        stage1 = plan.reused_stage1()
        jobs = [job for r, record in zip(plan.stage1_jobs(), stage1, strict=True)
                for job in follow_ups(r, record)]  # fmt: skip
        results = run_jobs(jobs + base_pass, plan.workers, run_sequential_job,
                           announce_and_keep, known=finished)  # fmt: skip
    results = reused + results
    summary = summarize(plan, stage1, results, time.perf_counter() - start)
    atomic_write_text(plan.out / "summary.json", json.dumps(summary, indent=2) + "\n")
    from entrogym.experiments.sequential_report import plot_sequential, report

    for path in plot_sequential(summary, plan.out / "plots"):
        print(path)
    print(report(summary))
    return summary
