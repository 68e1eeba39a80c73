"""Training configuration: data, not code.

Every field is settable from the command line (``--tasks-per-iter 8``) and from a YAML file
(``--config run.yaml`` with ``tasks_per_iter: 8``); the YAML keys are the field names below.
Defaults are the paper's where it gives one (appendix "Training"), sized down only where noted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass
class TrainConfig:
    """One RL run.

    Args:
        env: Gymnasium id of the training env (any registered text env, yours included).
        env_kwargs: keyword arguments for ``gymnasium.make(env, **env_kwargs)``.
        split: task split to train on (None = the env's default split).
        algo: preset name (rloo, grpo, loop, dapo, gspo, repo-r, repo-d, adapo, grpo-entropy-bonus).
        algo_overrides: fields of the preset to change, e.g. ``{minibatch_size: 256}`` (AIME).
        model: built-in model name, local Hugging Face folder, or hub id.
        engine: rollout engine: ``vllm`` (in-process), ``vllm-server`` (``engine_urls``), ``hf``.
        engine_urls: base URLs of running ``vllm serve`` instances (``vllm-server`` engine).
        engine_dtype: dtype of the rollout engine's weights.
        dtype: trainer parameter/compute dtype; log-probs for ratios are fp32 regardless.
        iterations: number of collect-then-update iterations.
        tasks_per_iter: tasks sampled per iteration; each gets ``samples`` rollouts (a group).
        samples: K, rollouts per task (paper: 6).
        max_response_tokens: per-turn generation budget (paper: 4096 for AIME).
        max_context_tokens: whole-episode context limit (paper: 32K for AppWorld).
        on_turn_budget: a turn that hits ``max_response_tokens``: ``truncate`` ends the episode
            as a failure (the paper's rule), ``step`` hands the cut text to the env and goes on.
        temperature: sampling temperature of rollouts.
        early_stop_min_per_task: rollouts per task needed before the batch may stop early.
        early_stop_fraction: share of all rollouts needed before stopping early (paper: 0.9).
        lr, weight_decay, max_grad_norm: AdamW and gradient clipping (paper: 5e-5, 0.01, 0.1).
        micro_batch_size: trajectories per forward/backward; gradients of a minibatch's
            micro-batches are accumulated, so this bounds activation memory, not the math.
        lora_rank, lora_alpha: LoRA on q, k, v, o, gate, up, down (paper: 16, 32).
        bf16_round_logprobs: emulate Thm 3's bf16 rounding of log-probs before the ratio (off).
        softmax_fix: fp64 recomputation of near-certain tokens' gradients (appendix; on).
        eval_env, eval_env_kwargs, eval_split, eval_every, eval_tasks, eval_samples: periodic
            held-out evaluation (pass@1 and pass@k with k = eval_samples) of the weights after
            the iteration's update; eval_every 0 disables it.
        out: run folder (metrics.jsonl, tb/, checkpoints/, plots).
        checkpoint_every: iterations between checkpoints (and always at the end).
        resume: continue the run in ``out`` from its latest complete checkpoint.
        init_adapter: start from this adapter / checkpoint / run folder (sequential training).
        max_bad_steps: stop after this many skipped (NaN/inf) optimizer steps in total.
        seed: seeds task sampling, rollouts and minibatch order.
        system_prompt: system message for the agent (None = the env's / template's default).
    """

    env: str = "entrogym/Arithmetic-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    split: str | None = None
    algo: str = "repo-r"
    algo_overrides: dict[str, Any] = field(default_factory=dict)
    model: str = "smollm2-135m-instruct"
    engine: Literal["vllm", "vllm-server", "hf"] = "vllm"
    engine_urls: list[str] = field(default_factory=list)
    engine_dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    iterations: int = 10
    tasks_per_iter: int = 8
    samples: int = 6
    max_response_tokens: int = 256
    max_context_tokens: int = 4096
    on_turn_budget: Literal["truncate", "step"] = "truncate"
    temperature: float = 1.0
    early_stop_min_per_task: int = 4
    early_stop_fraction: float = 0.9
    lr: float = 5e-5
    weight_decay: float = 0.01
    max_grad_norm: float = 0.1
    micro_batch_size: int = 8
    lora_rank: int = 16
    lora_alpha: int = 32
    bf16_round_logprobs: bool = False
    softmax_fix: bool = True
    eval_env: str | None = None
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_split: str | None = None
    eval_every: int = 0
    eval_tasks: int | None = None
    eval_samples: int = 1
    out: str = "runs/train"
    checkpoint_every: int = 5
    resume: bool = False
    init_adapter: str | None = None
    max_bad_steps: int = 10
    seed: int = 0
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        positive = (
            "iterations",
            "tasks_per_iter",
            "max_response_tokens",
            "checkpoint_every",
            "micro_batch_size",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples < 2:
            raise ValueError(
                f"samples must be >= 2 (K rollouts per task form a group), got {self.samples}"
            )
        if not 1 <= self.early_stop_min_per_task <= self.samples:
            raise ValueError(
                f"early_stop_min_per_task must be in [1, samples={self.samples}], "
                f"got {self.early_stop_min_per_task}"
            )
        if not 0 < self.early_stop_fraction <= 1:
            raise ValueError(
                f"early_stop_fraction must be in (0, 1], got {self.early_stop_fraction}"
            )
        if self.resume and self.init_adapter:
            raise ValueError(
                "use either resume (continue this run) or init_adapter (new run), not both"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
