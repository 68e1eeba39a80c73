"""The demo's fixed settings and one run's ``TrainConfig`` (``demo_config``).

Against the paper's setting the budget changes only what a CPU forces: fewer tasks and
rollouts per iteration, one epoch with two minibatches, a learning rate that moves a LoRA
policy within a few iterations, and one-digit arithmetic so that a 135M model earns some
reward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from entrogym.agents.config import AgentConfig
from entrogym.agents.engines import resolve_engine_kind
from entrogym.algos import AlgorithmConfig
from entrogym.train.evaluation.target_tracking import BAND, FIRST_TRACKED  # noqa: F401

if TYPE_CHECKING:
    from pathlib import Path

    from entrogym.train.config import TrainConfig

ENV = "entrogym/Arithmetic-v0"
ENV_KWARGS = {"max_digits": 1, "num_train": 100, "num_test": 40}
SYSTEM_PROMPT = "You are a careful calculator. Answer with the final number in \\boxed{}."
# The goal (docs/demo.md), per seed: a controlled run stays within +-BAND of its target at every
# iteration from the (FIRST_TRACKED + 1)-th on (both from target_tracking, which `entrogym
# compare` shares), while GRPO ends at <= FALL of its first iteration's entropy and the run's
# held-out accuracy is at most ACCURACY_SLACK below GRPO's.
FALL, ACCURACY_SLACK = 0.5, 0.05
# The runs, iterations, learning rate and seeds of ``make demo``; the runs that chose them are in
# docs/results.md#smollm2-demo-the-demo-runs-and-the-sweeps-behind-its-settings. A run is
# ``NAME=SPEC`` or a plain spec, read into a DemoRun by ``entrogym.commands.demo_runs``.
DEFAULT_RUNS = (
    "grpo",
    # the paper's preset (zeta from 1e-3, doubling, capped at 0.05), tracking the sampled
    # entropy as the paper does
    "repo-r=repo-r --algo.controller.estimator sampled",
    # the constraint H = H* by the method of multipliers, two-sided; what it holds is the
    # policy's exact entropy on fixed states, two batches sampled from the initial policy before
    # the first update and rescored every iteration (estimator probe): a batch's own entropy
    # moves 8-10 % with which 4 prompts were drawn, as much as the goal's band allows
    "held=grpo --algo.lever entropy-constraint --algo.lever.penalty 1 --algo.controller.min 0 "
    "--algo.controller.init 0 --algo.controller.target_probe 2 "
    "--algo.controller.estimator probe --algo.controller.step iteration",
)
DEFAULT_ITERATIONS = 15
# slow enough that the entropy falls over several iterations (the 3rd to the 6th), which a
# controller can answer; at 5e-4 every run's fell within one
DEFAULT_LR = 2.5e-4
# pass@k of every final policy and the base model: the first PASS_TASKS held-out tasks,
# PASS_SAMPLES samples each (pass@1, @4, @16); 16 x 16 keeps the demo within 15 minutes
PASS_TASKS, PASS_SAMPLES = 16, 16
DEFAULT_SEEDS = (0,)  # three runs of one seed fit 15 minutes on 2 cores
# Tasks x samples per iteration, half of them per minibatch (two optimizer steps); four tasks
# keep three runs of 15 iterations within 15 minutes on 2 cores.
TASKS, SAMPLES = 4, 4
# The update of every demo run unless its spec sets these: one pass, two optimizer steps per
# iteration, so the second minibatch is off-policy and the presets' clipping and REPO's
# shaping both act.
DEMO_UPDATE = {"epochs": 1, "minibatch_size": TASKS * SAMPLES // 2}
# The rollout settings every part of the demo shares (the base model's eval and all runs).
# static-cdf: the hf engine's merged-weight path with an inverse-CDF draw, ~2x generate's
# tokens/s on 2 cores from the same distribution (docs/rollouts.md); fp32 keeps the sampler's
# log-probs equal to the learner's.
AGENT = AgentConfig(
    model="smollm2-135m-instruct",
    engine="hf",
    engine_dtype="fp32",
    engine_decode="static-cdf",
    max_response_tokens=48,
    max_context_tokens=256,
    on_turn_budget="step",
    system_prompt=SYSTEM_PROMPT,
)


def demo_agent(
    engine: str | None = None, model: str | None = None, engine_dtype: str | None = None
) -> AgentConfig:
    """AGENT with ``engine``, ``model`` and ``engine_dtype`` replaced where given. The decode
    path belongs to the ``hf`` engine, so another engine samples its own way."""
    given = {"engine": engine, "model": model, "engine_dtype": engine_dtype}
    settings = asdict(AGENT) | {k: v for k, v in given.items() if v}
    settings["engine"] = resolve_engine_kind(settings["engine"])  # auto: hf on a CPU
    if settings["engine"] != "hf":
        settings["engine_decode"] = "generate"
    return AgentConfig(**settings)


@dataclass(frozen=True)
class DemoRun:
    """One run of the demo or the sequential experiment, as the commands read it from its text.

    Attributes:
        text: the run as given (``"held=grpo --algo.lever entropy-constraint ..."``).
        label: what the table, the log and the plots show (``NAME``, or the spec's own label).
        folder: the run folder's name.
        spec: the text without its ``NAME=`` (``grpo`` marks the goal's baseline).
        spec_folder: the folder the spec alone names (a run folder written before a ``NAME=``).
        algo: the algorithm, ``DEMO_UPDATE`` under the spec's own options.
    """

    text: str
    label: str
    folder: str
    spec: str
    spec_folder: str
    algo: AlgorithmConfig


def demo_config(
    algo: AlgorithmConfig,
    out: Path,
    iterations: int,
    lr: float,
    eval_tasks: int,
    *,
    seed: int = 0,
    engine: str | None = None,
    name: str | None = None,
    threads: int | None = None,
    model: str | None = None,
    env: str = ENV,
    env_kwargs: dict[str, Any] | None = None,
    init_adapter: str | None = None,
    eval_samples: int = 1,
    engine_dtype: str | None = None,
    eval_every: int | None = None,
    eval_split: str = "test",
    settings: dict[str, Any] | None = None,
) -> TrainConfig:
    """The demo's TrainConfig for one algorithm (a ``DemoRun``'s ``algo``); the run folder is
    ``out / (name or algo.name)``.
    ``eval_tasks=0`` turns the held-out evaluation off; ``engine`` and ``model`` replace
    AGENT's (tests use a tiny model). ``env`` and ``env_kwargs`` (default: the demo's task)
    name the task trained and evaluated on, and ``init_adapter`` the adapter it starts from
    (the sequential experiment's second stage); ``eval_samples`` samples each held-out task
    that many times (the accuracy is their mean, pass@1); ``engine_dtype`` replaces the
    sampler's fp32 (the learner stays fp32). ``eval_every`` evaluates every that many
    iterations as well (None: after the first and the last update only). ``eval_split`` is the
    held-out split, and ``settings`` are TrainConfig fields that replace the demo's for this
    task (a ``Task``'s own: a multi-turn env's tool format and context, say)."""
    from entrogym.train.config import TrainConfig

    env_kwargs = ENV_KWARGS if env_kwargs is None else env_kwargs
    agent = asdict(demo_agent(engine, model, engine_dtype))
    evaluation: dict[str, Any] = {"eval_env": None, "eval_every": 0, "eval_tasks": None}
    if eval_tasks:  # held-out accuracy after the first and the last update (the plots' panels)
        evaluation = {"eval_env": env, "eval_env_kwargs": env_kwargs, "eval_split": eval_split,
                      "eval_every": eval_every or iterations, "eval_tasks": eval_tasks,
                      "eval_samples": eval_samples}  # fmt: skip
    run = dict(
        **agent,
        env=env,
        env_kwargs=env_kwargs,
        split="train",
        init_adapter=init_adapter,
        algo=algo,
        dtype="fp32",
        iterations=iterations,
        tasks_per_iter=TASKS,
        samples=SAMPLES,
        early_stop_min_per_task=SAMPLES,
        early_stop_fraction=1.0,
        lr=lr,
        micro_batch_size=6,
        checkpoint_every=iterations,
        **evaluation,
        seed=seed,
        threads=threads,
        out=str(out / (name or algo.name)),
    )
    return TrainConfig(**(run | (settings or {})))
