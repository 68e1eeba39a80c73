"""``entrogym sequential`` (what ``make sequential`` runs): train on task A, then continue every
final policy on task B with one algorithm, and compare how the starts learn B."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from entrogym.commands.demo_runs import run_option
from entrogym.commands.options import make_parser, parse_options, run_command
from entrogym.experiments.config import DemoRun
from entrogym.train.shutdown import Interrupted

PROG = "entrogym sequential"


@dataclass
class SequentialOptions:
    """The sequential experiment's knobs (rollout settings are the demo's: entrogym.experiments.AGENT).

    Args:
        out: output folder (must be empty or new, unless --resume continues its experiment).
        pair: the task pair (A, B) by name; see entrogym.experiments.sequential.PAIRS.
        task_a: env id of task A instead of the pair's (with task_a_kwargs).
        task_a_kwargs: env kwargs of task_a.
        task_b: env id of task B instead of the pair's (with task_b_kwargs); it needs a
            held-out split (test).
        task_b_kwargs: env kwargs of task_b.
        runs: stage 1's runs; a preset, a labelled variant (``"repo-d --algo.controller pi"``)
            or ``NAME=SPEC`` for a short label. GRPO is labelled grpo; the last run is the held
            run the goals compare with it.
        seeds: one stage-1 run per seed and run, each continued on B with the same seed.
        stage1_iterations: RL iterations on task A.
        stage2_iterations: RL iterations on task B.
        stage2_algo: the one algorithm every stage-1 adapter is trained with on B.
        lr: AdamW learning rate of the LoRA, in both stages.
        eval_tasks: held-out tasks per evaluation (after the first and last update of a run).
        eval_samples: samples per held-out task at each evaluation; the accuracy is their
            mean (pass@1), so more samples measure it with less noise.
        stage2_eval_every: evaluate stage 2 on B's held-out tasks every this many iterations
            as well (0: after the first and the last update only); the summary gets each
            run's accuracy curve, and ``accuracy_late``, its mean over stage 2's second half.
        pass_tasks: task A's held-out tasks scored for pass@k.
        pass_samples: samples per task for pass@k (k = 1, 4, 16, 64 up to it, and it).
        engine: rollout engine (None: the demo's, entrogym.experiments.AGENT.engine).
        model: model name (None: the demo's SmolLM2; tests use tiny-random-llama).
        workers: worker processes side by side, one thread each (None: two per core).
        stage1_from: continue a finished stage 1 instead of training it again: a previous
            ``entrogym sequential`` out, or an ``entrogym demo`` out (FOLDER/seedS/RUN), whose
            runs were trained as this experiment's would be (task A and its kwargs, each run's
            spec, the model, lr, iterations and seeds; any difference is refused).
        resume: continue the stopped experiment in ``out`` (the same options; --workers may
            change): its finished jobs are kept, a run stopped after a checkpoint goes on from
            it, the others run.
    """

    out: str = "runs/sequential"
    pair: str = "add1-add2"
    task_a: str | None = None
    task_a_kwargs: dict[str, Any] = field(default_factory=dict)
    task_b: str | None = None
    task_b_kwargs: dict[str, Any] = field(default_factory=dict)
    runs: list[str] = field(default_factory=lambda: list(_default_runs()))
    seeds: list[int] = field(default_factory=lambda: [0])
    stage1_iterations: int = 15
    stage2_iterations: int = 10
    stage2_algo: str = "grpo"
    lr: float = 2.5e-4
    eval_tasks: int = 40
    eval_samples: int = 1
    stage2_eval_every: int = 0
    pass_tasks: int = 16
    pass_samples: int = 64
    engine: str | None = None
    model: str | None = None
    workers: int | None = None
    stage1_from: str | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        from entrogym.experiments.sequential import PAIRS

        if self.pair not in PAIRS:
            raise ValueError(f"pair: unknown pair {self.pair!r}; choose from {', '.join(PAIRS)}")
        if not self.runs:
            raise ValueError("runs: give one or more runs; the last is the held run")
        _ = self.stage1_runs, self.stage2_run  # a run that does not parse is named first
        for name in ("stage1_iterations", "stage2_iterations", "eval_tasks", "eval_samples",
                     "pass_tasks", "pass_samples"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.stage2_eval_every < 0:
            raise ValueError(f"stage2_eval_every must be >= 0, got {self.stage2_eval_every}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: give one or more distinct seeds, got {self.seeds}")
        if Path(self.out).exists() and not Path(self.out).is_dir():
            raise ValueError(f"out: {self.out} is a file; pass a folder for the experiment")
        if self.stage1_from is not None and not Path(self.stage1_from).is_dir():
            raise ValueError(f"stage1_from: {self.stage1_from} is not a folder")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        cores = os.cpu_count() or 1
        if self.workers is not None and not 1 <= self.workers <= 2 * cores:
            raise ValueError(f"workers must be from 1 to {2 * cores}, got {self.workers}")

    @cached_property
    def stage1_runs(self) -> list[DemoRun]:
        """``runs`` read once (ValueError naming the one that does not parse)."""
        return [run_option("runs", text) for text in self.runs]

    @cached_property
    def stage2_run(self) -> DemoRun:
        return run_option("runs", self.stage2_algo)


def _default_runs() -> tuple[str, ...]:
    from entrogym.experiments.sequential import RUNS

    return RUNS


def check_task(role: str, env: str, kwargs: dict[str, Any], held_out: str = "test") -> None:
    """The env makes, and has a ``held_out`` split with tasks (ValueError naming the option)."""
    from entrogym.commands.preflight import check_env_id
    from entrogym.envs.base import make_text_env, task_ids_of

    check_env_id(env, f"task_{role}")  # a module:id whose module fails to import: one line
    try:
        made = make_text_env(env, **kwargs)
    except Exception as exc:  # an unknown id or a keyword the env refuses
        raise ValueError(f"task_{role}: cannot make {env!r} with {kwargs}: {exc}") from None
    try:
        splits = tuple(getattr(made.unwrapped, "splits", ()))
        if held_out not in splits:
            raise ValueError(f"task_{role}: {env!r} has no held-out {held_out!r} split (its "
                             f"splits: {list(splits)}); choose a task with one")  # fmt: skip
        if not task_ids_of(made, held_out):
            raise ValueError(f"task_{role}: {env!r} has no tasks in its {held_out!r} split")
    finally:
        made.close()


def build_parser() -> Any:
    from entrogym.experiments import sequential

    return make_parser(PROG, (sequential.__doc__ or "").split("\n")[0], SequentialOptions)


def cli(argv: list[str]) -> int:
    def body() -> int:
        from entrogym.experiments.sequential import PAIRS, Plan, Task, TaskPair, run_sequential

        opts = parse_options(build_parser(), argv, SequentialOptions)
        pair = PAIRS[opts.pair]
        a = Task(opts.task_a, opts.task_a_kwargs) if opts.task_a else pair.a
        b = Task(opts.task_b, opts.task_b_kwargs) if opts.task_b else pair.b
        for role, task in (("a", a), ("b", b)):  # before any model loads
            check_task(role, task.env, task.env_kwargs, task.held_out)
        name = opts.pair if (a, b) == (pair.a, pair.b) else "custom"
        why = pair.why if name == opts.pair else "given on the command line"
        cores = os.cpu_count() or 1
        plan = Plan(Path(opts.out), name, TaskPair(a, b, why), runs=opts.stage1_runs, seeds=opts.seeds,
                    stage1_iterations=opts.stage1_iterations,
                    stage2_iterations=opts.stage2_iterations, stage2_algo=opts.stage2_run,
                    lr=opts.lr, eval_tasks=opts.eval_tasks,
                    eval_samples=opts.eval_samples,
                    stage2_eval_every=opts.stage2_eval_every, pass_tasks=opts.pass_tasks,
                    pass_samples=opts.pass_samples, workers=opts.workers or 2 * cores,
                    threads=1, model=opts.model,
                    stage1_from=Path(opts.stage1_from) if opts.stage1_from else None,
                    resume=opts.resume,
                    **({"engine": opts.engine} if opts.engine else {}))  # fmt: skip
        if plan.stage1_from is not None:
            plan.stage1_folders()  # another experiment's stage 1: one line, before any model
        try:
            run_sequential(plan)
        except Interrupted as stop:  # a run trained in this process (--workers 1)
            print(f"{PROG}: {stop}; {STOPPED}", file=sys.stderr)
            return stop.exit_code
        except (
            SystemExit
        ) as stop:  # SIGTERM while the job processes ran (entrogym.experiments.pool)
            if stop.code not in (128 + signal.SIGTERM, 128 + signal.SIGINT):
                raise
            name = signal.Signals(int(stop.code) - 128).name
            print(f"{PROG}: {name}: the job processes were stopped; {STOPPED}", file=sys.stderr)
            return int(stop.code)
        return 0

    return run_command(PROG, body, interrupted=STOPPED)


# the finished jobs are in OUT/jobs.jsonl, a stopped run's checkpoint in its folder
STOPPED = "interrupted; continue the experiment with the same command and --resume"
