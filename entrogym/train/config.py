"""Training configuration: data, not code.

Every field is settable from the command line (``--tasks-per-iter 8``) and from a YAML file
(``--config run.yaml`` with ``tasks_per_iter: 8``); the YAML keys are the field names below.
Defaults are the paper's where it gives one (appendix "Training"), sized down only where noted.

The algorithm is an ``AlgorithmConfig``: a preset with its parts' knobs, read from the command
line (``--algo repo-d --algo.controller pi --algo.controller.kp 0.3``) or a YAML file's
``algo: {name: repo-d, controller: {name: pi, kp: 0.3}}`` by the commands; :meth:`to_dict`
writes it as its mapping (``algorithm_mapping``), the form a run folder's ``config.yaml`` holds.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from entrogym.agents.config import AgentConfig
from entrogym.agents.env_workers import (
    DEFAULT_ENV_MEMORY_MB,
    DEFAULT_ENV_TIMEOUT_S,
    DEFAULT_ENV_WORKERS,
    EnvLimits,
    check_env_limits,
)
from entrogym.algos import LEVERS, AlgorithmConfig, algorithm_mapping, get_algorithm
from entrogym.algos.aepo import Aepo
from entrogym.algos.algorithm import target_params
from entrogym.algos.step_guard import DEFAULT_MAX_BAD_STEPS_IN_ROW
from entrogym.dtypes import DTypeName
from entrogym.models import LORA_TARGETS
from entrogym.train.folder.trackers import NO_TRACKER, parse_report_to

# Padded tokens per learner micro-batch: about 5 GB of activations for a 135M model in fp32
# (~2.5 MB a token), whatever the episodes' length; single-turn batches stay under it.
DEFAULT_MICRO_BATCH_TOKENS = 2048
MAX_SEED = 2**32 - 1
EARLY_STOP_MIN_PER_TASK = 4  # early_stop_min_per_task unless samples is fewer  # numpy's seed range; every seed the run derives stays within int64


# How an async run with the in-process hf engine splits the cores
# (entrogym.train.sampler.threads).
ThreadSplitName = Literal["even", "cost", "elastic"]
THREAD_SPLITS: tuple[str, ...] = get_args(ThreadSplitName)
# Where the importance ratio's denominator comes from (``TrainConfig.old_logprobs``).
OldLogprobsName = Literal["learner", "sampler"]
OLD_LOGPROBS: tuple[str, ...] = get_args(OldLogprobsName)


@dataclass
class TrainConfig(AgentConfig):
    """One RL run (the rollout options, model to system_prompt, are shared with eval and the demo).

    Args:
        env: Gymnasium id of the training env (any registered text env, yours included, or
            ``module:id`` to import your module first).
        env_kwargs: keyword arguments for ``gymnasium.make(env, **env_kwargs)``.
        split: task split to train on (None = the env's default split).
        algo: the algorithm: a preset and its parts' knobs, ``--algo repo-d --algo.controller
            pi --algo.controller.kp 0.3`` (YAML ``algo: {name: repo-d, controller: {name: pi,
            kp: 0.3}}``); the algorithm options below list every preset, part and knob.
        dtype: trainer parameter/compute dtype; log-probs for ratios are fp32 regardless.
        iterations: number of collect-then-update iterations.
        max_staleness: K, how many weight versions old a batch may be. 0: collect, then update
            (synchronous). K >= 1: the rollouts of iterations i+1 .. i+K are collected while
            iteration i updates, and iteration i trains on the batch sampled by version i - K,
            rescored under that version (docs/async.md).
        tasks_per_iter: tasks sampled per iteration; each gets ``samples`` rollouts (a group).
        samples: K, rollouts per task (paper: 6).
        early_stop_min_per_task: rollouts per task needed before the batch may stop early
            (None: 4, or ``samples`` where that is fewer).
        early_stop_fraction: share of all rollouts needed before stopping early (paper: 0.9).
        max_env_error_fraction: share of an iteration's episodes that may fail on an env error
            before the run stops (naming the first failure).
        env_workers: env worker processes running the envs' reset and step (the samples of a
            task share one); 0 = in the trainer's process, without time or memory limits (for
            debugging).
        env_timeout: seconds one env call (reset, step) may take in a worker before its
            episode fails as an env error and the worker is replaced.
        env_max_memory_mb: address-space limit of each env worker (MB); an allocation past it
            fails that env call with MemoryError.
        lr: AdamW learning rate (paper: 5e-5).
        weight_decay: AdamW weight decay (paper: 0.01).
        max_grad_norm: gradient clipping norm (paper: 0.1).
        micro_batch_size: trajectories per forward/backward; gradients of a minibatch's
            micro-batches are accumulated, so this bounds activation memory, not the math.
        micro_batch_tokens: also cap a micro-batch's tokens (rows x its longest row): long
            multi-turn episodes then go fewer to a micro-batch, one alone if it is longer.
            Activation memory grows with these tokens; null = rows only.
        threads: torch CPU threads of the learner (None = torch's default; in an async run with
            the hf engine, half the cores, the rollout thread taking the rest).
        thread_split: how an async run with the hf engine splits the cores between the rollout
            thread and the learner: ``elastic`` (the default: half and half, or ``threads``
            for the learner, while both run, and every core to the learner while the rollout
            thread waits for a version; the learner's thread count then depends on timings,
            and the gradients' last bits with it, so two runs or a resumed one are not bit
            for bit the same), ``cost`` (re-chosen after every iteration from each side's
            measured core-seconds; not bit for bit either) or ``even`` (half and half, fixed:
            the split for a run that must be reproducible bit for bit, resume included).
        trim_heap: give freed heap memory back to the operating system after the rollouts
            and after each backward (glibc's ``malloc_trim``; :mod:`entrogym.train.heap`): a
            lower peak resident memory for the cost of faulting those pages in again.
        old_logprobs: where the importance ratio's denominator, the sampling policy's
            log-prob of each sampled token, comes from. ``learner`` (the paper's): the
            trainer's own fp32 scores, from the update's first scoring pass and a no-grad pass
            over the other rows, or, for a stale batch (``max_staleness``), a pass over every
            row under the weight version that sampled it. ``sampler``: the engine's log-probs
            of the tokens it drew, with no scoring pass (other trainers' option not to
            recompute them, e.g. Tunix's, google/tunix#1487). Needs the ``hf`` engine in fp32,
            whose log-probs match the trainer's to ~1e-5 nats (docs/results.md); the
            ``sampler_mismatch`` metrics are then not measured, and ``algo.is_correction``,
            which would weigh every token by 1, is refused. A batch with a non-finite sampler
            log-prob is scored by the learner.
        score_layout: how a micro-batch is laid out for the scoring forward pass: ``trimmed``
            (cut to its own longest row; exact), ``padded`` (the batch's width), or ``packed``
            (one padding-free row with per-sequence position ids; within ~1e-5 in fp32), or
            ``shared-prefix`` (the opening every row of the micro-batch shares, such as a
            multi-turn env's tools and worked examples, run once, the rest packed after it;
            needs ``action_only_head``; within ~1e-5 in fp32).
        action_only_head: run the LM head, log-softmax and entropy only at action positions
            (the body still sees the whole context); exact, and most of the head's cost saved
            where prompts and env feedback dominate.
        sampler_entropy_check: log ``sampler_entropy_gap`` / ``sampler_entropy_z`` each
            iteration (one extra no-grad scoring pass with exact entropies): whether the engine
            drew its tokens from the policy; |z| > 4 means it did not (e.g. a top-k sampler).
            Needs temperature 1, where the policy is the distribution sampled.
        input_dependence_every: iterations between measurements of the input dependence
            (0 = never; every iteration when ``algo.controller.estimator`` is
            ``input_dependence``): how much the responses depend on the task, the mutual
            information of ``input_dependence_tasks`` fixed tasks and ``samples`` responses to
            each, sampled by the current weights and scored after every task's prompt before
            the update (``entrogym.train.input_probe``; docs/runs.md). Logged as
            ``input_dependence`` (nats) beside ``entropy``.
        input_dependence_tasks: the probe tasks of the input dependence, drawn once from the
            training split (>= 2; I is at most log of it).
        lora_rank: LoRA rank (paper: 16).
        lora_target_modules: names of the layers LoRA adapts (paper: q, k, v, o, gate, up,
            down projections); an architecture with other names needs its own (a missing one
            is named with the model's linear layers).
        lora_alpha: LoRA alpha (paper: 32).
        softmax_fix: fp64 recomputation of near-certain tokens' gradients (appendix).
        eval_env: env of the periodic held-out evaluation (None = no evaluation).
        eval_env_kwargs: keyword arguments of the eval env.
        eval_split: split to evaluate (None = the env's held-out split, never train).
        eval_every: iterations between evaluations of the updated weights (0 = never).
        eval_tasks: first N tasks of the eval split (None = all).
        eval_samples: samples per eval task (pass@k at k = 1, 4, 16, 64 up to it, and at it).
        out: run folder (metrics.jsonl, tb/, checkpoints/, plots).
        report_to: trackers that get every metrics row besides metrics.jsonl, comma-separated:
            tensorboard (RUN/tb), wandb (offline without WANDB_API_KEY), trackio, mlflow
            (RUN/mlflow.db), or none; each but tensorboard is an install extra.
        checkpoint_every: iterations between checkpoints (and always at the end).
        resume: continue the run in ``out`` from its latest complete checkpoint.
        init_adapter: start from this adapter / checkpoint / run folder (sequential training).
        max_bad_steps: stop after this many skipped (NaN/inf) optimizer steps in total.
        max_bad_steps_in_row: stop, naming the loss term at fault, after this many optimizer
            steps in a row skipped for NaN/inf scores, losses or gradients (0 = never; fp16's
            loss-scale overflows while its scale is above 1 do not count).
        seed: seeds task sampling, rollouts and minibatch order (0 to 2**32 - 1).
        shutdown_grace: seconds a run stopped by SIGTERM or Ctrl-C has to finish or abandon
            its iteration and write a checkpoint before it exits anyway.
    """

    env: str = "entrogym/Arithmetic-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str | None = None
    algo: AlgorithmConfig = field(default_factory=lambda: get_algorithm("repo-r"))
    dtype: DTypeName = "fp32"
    iterations: int = 10
    max_staleness: int = 0
    tasks_per_iter: int = 8
    samples: int = 6
    early_stop_min_per_task: int | None = None
    early_stop_fraction: float = 0.9
    max_env_error_fraction: float = 0.5
    env_workers: int = DEFAULT_ENV_WORKERS
    env_timeout: float = DEFAULT_ENV_TIMEOUT_S
    env_max_memory_mb: int = DEFAULT_ENV_MEMORY_MB
    lr: float = 5e-5
    weight_decay: float = 0.01
    max_grad_norm: float = 0.1
    micro_batch_size: int = 8
    micro_batch_tokens: int | None = DEFAULT_MICRO_BATCH_TOKENS
    threads: int | None = None
    thread_split: ThreadSplitName = "elastic"
    trim_heap: bool = True
    sampler_entropy_check: bool = False
    input_dependence_every: int = 0
    input_dependence_tasks: int = 4
    old_logprobs: OldLogprobsName = "learner"
    score_layout: Literal["padded", "trimmed", "packed", "shared-prefix"] = "trimmed"
    action_only_head: bool = True
    lora_rank: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    lora_alpha: int = 32
    softmax_fix: bool = True
    eval_env: str | None = None
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_split: str | None = None
    eval_every: int = 0
    eval_tasks: int | None = None
    eval_samples: int = 1
    out: str = "runs/train"
    report_to: str = "tensorboard"
    checkpoint_every: int = 5
    resume: bool = False
    init_adapter: str | None = None
    max_bad_steps: int = 10
    max_bad_steps_in_row: int = DEFAULT_MAX_BAD_STEPS_IN_ROW
    seed: int = 0
    shutdown_grace: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.algo, AlgorithmConfig):
            raise ValueError(
                f"algo must be an AlgorithmConfig, got {self.algo!r}; build one from a preset "
                "and its knobs with entrogym.algos.build_algorithm"
            )
        self.report_to = ",".join(parse_report_to(self.report_to)) or NO_TRACKER
        positive = (
            "iterations",
            "tasks_per_iter",
            "checkpoint_every",
            "micro_batch_size",
            "lora_rank",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(
                f"micro_batch_tokens must be >= 1 or null, got {self.micro_batch_tokens}"
            )
        self._check_run_values()
        _check_lever_fits(self)
        self._check_learning_values()
        self._check_eval_values()

    def _check_learning_values(self) -> None:
        """Values that would train nothing or fail only later (NaN fails every check)."""
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed}")
        for name in ("max_bad_steps", "max_bad_steps_in_row"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.shutdown_grace >= 0:
            raise ValueError(f"shutdown_grace must be >= 0 seconds, got {self.shutdown_grace}")
        check_env_limits(self.env_workers, self.env_timeout, self.env_max_memory_mb)

    def _check_eval_values(self) -> None:
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.eval_samples < 1:
            raise ValueError(f"eval_samples must be >= 1, got {self.eval_samples}")
        if self.eval_tasks is not None and self.eval_tasks < 1:
            raise ValueError(f"eval_tasks must be >= 1 or unset, got {self.eval_tasks}")

    @property
    def measures_input_dependence(self) -> bool:
        """Whether the run measures the input dependence at all: every
        ``input_dependence_every`` iterations, or for a controller that tracks it."""
        params = target_params(self.algo)
        tracked = params is not None and params.estimator == "input_dependence"
        return tracked or self.input_dependence_every > 0

    def env_limits(self) -> EnvLimits:
        """How the run's envs are isolated (``env_workers``, ``env_timeout``, memory)."""
        return EnvLimits(self.env_workers, self.env_timeout, self.env_max_memory_mb)

    def _check_run_values(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(
                f"max_staleness must be >= 0 (0 = synchronous), got {self.max_staleness}"
            )
        if self.max_loras is not None and self.max_staleness + 1 > self.max_loras:
            raise ValueError(
                f"max_staleness {self.max_staleness} samples with the adapters of "
                f"{self.max_staleness + 1} weight versions, more than max_loras="
                f"{self.max_loras} the engine holds; raise --max-loras or lower --max-staleness"
            )
        if self.samples < 2:
            raise ValueError(
                f"samples must be >= 2 (K rollouts per task form a group), got {self.samples}"
            )
        if self.early_stop_min_per_task is None:  # derived from samples: never above it
            self.early_stop_min_per_task = min(EARLY_STOP_MIN_PER_TASK, self.samples)
        if not 1 <= self.early_stop_min_per_task <= self.samples:
            raise ValueError(
                f"early_stop_min_per_task must be in [1, samples={self.samples}], "
                f"got {self.early_stop_min_per_task}"
            )
        if not 0 < self.early_stop_fraction <= 1:
            raise ValueError(
                f"early_stop_fraction must be in (0, 1], got {self.early_stop_fraction}"
            )
        if self.sampler_entropy_check and self.temperature != 1.0:
            raise ValueError(
                "sampler_entropy_check compares samples with the policy's entropy and needs "
                f"temperature 1 (got {self.temperature}); drop one of them"
            )
        if self.input_dependence_every < 0:
            raise ValueError(
                f"input_dependence_every must be >= 0 (0 = never), got {self.input_dependence_every}"
            )
        if self.measures_input_dependence and self.input_dependence_tasks < 2:
            raise ValueError(
                "input_dependence_tasks must be >= 2 (one task's responses carry no information "
                f"about the task), got {self.input_dependence_tasks}"
            )
        if not 0 <= self.max_env_error_fraction <= 1:
            raise ValueError(
                f"max_env_error_fraction must be in [0, 1], got {self.max_env_error_fraction}"
            )
        _check_old_logprobs(self)
        if self.thread_split not in THREAD_SPLITS:
            raise ValueError(
                f"thread_split must be 'even', 'cost' or 'elastic', got {self.thread_split!r}"
            )
        cores = os.cpu_count() or 1
        if self.threads is not None and not 1 <= self.threads <= cores:
            raise ValueError(
                f"threads must be in [1, {cores}] (this machine's cores) or None, "
                f"got {self.threads}"
            )
        if self.resume and self.init_adapter:
            raise ValueError(
                "use either resume (continue this run) or init_adapter (new run), not both"
            )

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (``config.yaml``, trackers): the algorithm as its mapping."""
        return {**asdict(self), "algo": algorithm_mapping(self.algo)}


def _check_lever_fits(cfg: TrainConfig) -> None:
    """What the chosen lever needs of the run, refused here rather than at the first loss."""
    lever = cfg.algo.lever.name
    if issubclass(LEVERS.get(lever), Aepo) and cfg.max_staleness:
        raise ValueError(
            f"lever {lever} draws its samples at temperature T from the current weights "
            f"just before each update, so it runs synchronously only: pass --max-staleness 0 "
            f"(got {cfg.max_staleness}) or choose another lever"
        )


def _check_old_logprobs(cfg: TrainConfig) -> None:
    """``old_logprobs``: a name it knows, and ``sampler`` only where the engine's log-probs are
    exact and no correction weighs them against the learner's."""
    if cfg.old_logprobs not in OLD_LOGPROBS:
        raise ValueError(f"old_logprobs must be 'learner' or 'sampler', got {cfg.old_logprobs!r}")
    if cfg.old_logprobs != "sampler":
        return
    if (cfg.engine, cfg.engine_dtype) != ("hf", "fp32"):
        raise ValueError(
            f"old_logprobs sampler takes the engine's log-probs as the ratio's denominator, "
            f"measured exact only from the hf engine in fp32 (engine {cfg.engine!r}, "
            f"engine_dtype {cfg.engine_dtype!r}); pass --engine hf --engine-dtype fp32 or "
            "--old-logprobs learner"
        )
    if cfg.algo.is_correction is not None:
        raise ValueError(
            f"algo.is_correction {cfg.algo.is_correction!r} weighs learner against sampler "
            "log-probs, which old_logprobs sampler makes equal; drop one of them"
        )
