"""The RL training recipe: collect -> rescore in fp32 -> update -> hand the adapter over.

Read ``Trainer.iteration`` top to bottom: it is the paper's loop (appendix "Training") and holds
no math of its own; every formula is a named function in ``entrogym.algos``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.episode import Episode
from entrogym.agents.mismatch import sampler_mismatch
from entrogym.agents.rollout import collect_rollouts
from entrogym.algos.buffer import Batch, EpisodeBuffer
from entrogym.algos.presets import get_algorithm
from entrogym.algos.update import EntropyControl, policy_update
from entrogym.atomic import atomic_write_text
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train.checkpoint import (
    latest_checkpoint,
    load_adapter_into,
    load_checkpoint,
    save_checkpoint,
)
from entrogym.train.config import TrainConfig
from entrogym.train.evaluation import evaluate_policy
from entrogym.train.logprobs import sequence_logprobs, sequence_logprobs_and_entropy
from entrogym.train.metrics import MetricsLogger, progress
from entrogym.train.policy import LoraSettings, load_policy, save_adapter, trainable_parameters
from entrogym.train.precision import loss_scaler_for, resolve_dtype


class TrainingStopped(RuntimeError):
    """Raised when the run cannot go on (too many non-finite steps)."""


def usable_episodes(episodes: list[Episode]) -> list[Episode]:
    """Episodes that can enter the loss: with action tokens, in groups of at least two."""
    with_actions = [e for e in episodes if e.num_action_tokens > 0]
    sizes: dict[int, int] = {}
    for e in with_actions:
        sizes[e.group_id] = sizes.get(e.group_id, 0) + 1
    return [e for e in with_actions if sizes[e.group_id] >= 2]


def pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, length - x.shape[1]))


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.algo = get_algorithm(cfg.algo, **cfg.algo_overrides)
        self.run_dir = Path(cfg.out)
        self._check_run_dir()
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        env = make_text_env(cfg.env, **cfg.env_kwargs)
        self.tasks = task_ids_of(env, cfg.split)
        env.close()
        if not self.tasks:
            raise ValueError(f"env {cfg.env!r} has no tasks in split {cfg.split!r}")

        self.policy = load_policy(
            cfg.model,
            dtype=cfg.dtype,
            lora=LoraSettings(r=cfg.lora_rank, alpha=cfg.lora_alpha),
            seed=cfg.seed,
        )
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
        self.scaler = loss_scaler_for(resolve_dtype(cfg.dtype))
        self.control = EntropyControl(self.algo)
        self.agent = LLMAgent.from_model(
            cfg.model,
            system_prompt=cfg.system_prompt,
            max_turn_tokens=cfg.max_response_tokens,
            max_context=cfg.max_context_tokens,
            on_turn_budget=cfg.on_turn_budget,
        )
        self.pad_id = self.agent.tokenizer.pad_token_id or 0
        self.logprob_opts = {
            "softmax_fix": cfg.softmax_fix,
            "bf16_round_logprobs": cfg.bf16_round_logprobs,
        }
        # Engines may seed torch at start: start it before a resume restores the RNG states.
        self.engine = make_engine(
            cfg.engine,
            cfg.model,
            dtype=cfg.engine_dtype,
            max_model_len=cfg.max_context_tokens,
            urls=cfg.engine_urls or None,
            seed=cfg.seed,
        )
        self.start, self.cumulative_entropy, self.bad_steps, self.best = 0, 0.0, 0, -1.0
        resume_rows = self._restore()
        self.logger = MetricsLogger(self.run_dir, resume_rows=resume_rows)
        atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict()))

    # ----- setup ----------------------------------------------------------------------------

    def _check_run_dir(self) -> None:
        used = (self.run_dir / "metrics.jsonl").exists() or (self.run_dir / "checkpoints").exists()
        if used and not self.cfg.resume:
            raise ValueError(
                f"run folder {self.run_dir} already holds a run; pass --resume to continue it "
                "or --out NEW_DIR to start another"
            )

    def _restore(self) -> int | None:
        """Resume from the latest complete checkpoint, or load --init-adapter; return the
        number of metrics rows to keep (None = fresh run)."""
        if self.cfg.init_adapter:
            load_adapter_into(self.policy, self.cfg.init_adapter, base_model=self.cfg.model)
        if not self.cfg.resume:
            return None
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            print(f"entrogym train: no checkpoint in {self.run_dir}; starting from scratch")
            return 0
        state = load_checkpoint(
            ckpt,
            model=self.policy,
            optimizer=self.optimizer,
            scaler=self.scaler,
            base_model=self.cfg.model,
        )
        self.control.load_state_dict(state["control"])
        self.start = state["iteration"] + 1
        self.cumulative_entropy = state["cumulative_entropy"]
        self.bad_steps, self.best = state["bad_steps"], state["best"]
        print(f"entrogym train: resuming {self.run_dir} after iteration {state['iteration']}")
        return state["metrics_rows"]

    # ----- the loop -------------------------------------------------------------------------

    def fit(self) -> None:
        cfg = self.cfg
        for it in progress(range(self.start, cfg.iterations), desc="iterations", unit="iter"):
            row = self.iteration(it)
            self.logger.log(row, step=it)
            print(_summary_line(row), flush=True)
            improved = False
            if (
                cfg.eval_env
                and cfg.eval_every
                and (it % cfg.eval_every == 0 or it == cfg.iterations - 1)
            ):
                eval_row = self.evaluate(it)
                self.logger.log(eval_row, step=it)
                improved = eval_row["pass@1"] > self.best
                self.best = max(self.best, eval_row["pass@1"])
            if (it + 1) % cfg.checkpoint_every == 0 or it == cfg.iterations - 1 or improved:
                self.checkpoint(it, best=improved)
            if self.bad_steps > cfg.max_bad_steps:
                raise TrainingStopped(
                    f"{self.bad_steps} optimizer steps were skipped for non-finite losses or "
                    f"gradients (max_bad_steps={cfg.max_bad_steps}); lower lr or use dtype fp32"
                )

    def iteration(self, it: int) -> dict[str, Any]:
        cfg = self.cfg
        # 1. Rollouts with the current policy's adapter (a new folder per version).
        adapter = save_adapter(self.policy, self.run_dir / "adapters" / f"v{it:06d}")
        tasks = random.Random(cfg.seed * 1_000_003 + it).sample(
            self.tasks, min(cfg.tasks_per_iter, len(self.tasks))
        )
        t0 = time.perf_counter()
        rollouts = collect_rollouts(
            cfg.env,
            tasks,
            self.engine,
            self.agent,
            k=cfg.samples,
            sampling=SamplingParams(temperature=cfg.temperature),
            adapter=str(adapter),
            min_done_per_task=cfg.early_stop_min_per_task,
            min_done_fraction=cfg.early_stop_fraction,
            env_kwargs=cfg.env_kwargs,
            seed=cfg.seed * 1_000_003 + it * len(tasks) * cfg.samples,
        )
        rollout_s = time.perf_counter() - t0
        episodes = usable_episodes(list(rollouts))
        if not episodes:
            raise TrainingStopped(f"iteration {it}: no episode with action tokens came back")
        batch = EpisodeBuffer(self.pad_id, episodes).to_batch()

        # 2. Old log-probs recomputed on the trainer in fp32 (never the engine's).
        t0 = time.perf_counter()
        with torch.no_grad():
            old_logprobs = self.score(batch, torch.arange(len(batch)), need_entropy=False)[0]
        mismatch = sampler_mismatch(old_logprobs, batch.sampler_logprobs, batch.action_mask)

        # 3. The preset's update: advantages, entropy control, clipped loss, steps.
        metrics = policy_update(
            self.algo,
            self.control,
            rewards=batch.rewards,
            group_ids=batch.group_ids,
            old_logprobs=old_logprobs,
            mask=batch.action_mask,
            score=lambda index, need: self.score(batch, index, need),
            backward=lambda loss: self.scaler.scale(loss).backward(),
            step=self.step,
            micro_batch_size=self.cfg.micro_batch_size,
            generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + it),
        )
        update_s = time.perf_counter() - t0
        self.bad_steps += metrics["skipped_steps"]
        self.cumulative_entropy += metrics["entropy"]
        n_groups = len(set(batch.group_ids.tolist()))
        if metrics["zero_adv_groups"] == n_groups:
            print(
                f"iteration {it}: all {n_groups} groups have equal rewards within the group; "
                "no policy-gradient signal this iteration",
                file=sys.stderr,
            )
        action_tokens = batch.action_mask.sum(dim=1)
        return {
            "iteration": it,
            "algo": self.algo.name,
            **metrics,
            "cumulative_entropy": self.cumulative_entropy,
            "success_rate": _success_rate(episodes),
            "response_tokens_mean": float(action_tokens.mean()),
            "episodes": len(episodes),
            "groups": n_groups,
            "sampler_mismatch": mismatch["mean_abs_diff"],
            "sampler_mismatch_max": mismatch["max_abs_diff"],
            "sampler_ratio_outside": mismatch["frac_ratio_outside"],
            "rollout_s": rollout_s,
            "update_s": update_s,
            "tokens_per_s": rollouts.stats["tokens_per_s"],
        }

    # ----- pieces the update calls ----------------------------------------------------------

    def score(
        self, batch: Batch, index: torch.Tensor, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of rows ``index``, padded back to the batch's T.

        Runs in chunks of ``micro_batch_size`` under the caller's grad mode (the update passes
        micro-batches of exactly that size, so each backward sees one chunk)."""
        rows = batch.select(index)
        fn = sequence_logprobs_and_entropy if need_entropy else sequence_logprobs
        lps, ents = [], []
        for s in range(0, len(rows), self.cfg.micro_batch_size):
            out = fn(
                self.policy,
                rows.input_ids[s : s + self.cfg.micro_batch_size],
                rows.attention_mask[s : s + self.cfg.micro_batch_size],
                **self.logprob_opts,
            )
            lp, ent = out if need_entropy else (out, None)
            lps.append(lp)
            ents.append(ent)
        t = batch.input_ids.shape[1]
        lp = pad_to(torch.cat(lps), t)
        return lp, pad_to(torch.cat(ents), t) if need_entropy else None

    def step(self) -> bool:
        found_inf = self.scaler.unscale_(self.optimizer)
        if not found_inf:
            torch.nn.utils.clip_grad_norm_(
                trainable_parameters(self.policy), self.cfg.max_grad_norm
            )
        stepped = self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    def evaluate(self, it: int) -> dict[str, Any]:
        cfg = self.cfg
        adapter = self.run_dir / "adapters" / f"v{it:06d}"
        result = evaluate_policy(
            self.engine,
            self.agent,
            cfg.eval_env,
            split=cfg.eval_split,
            samples=cfg.eval_samples,
            max_tasks=cfg.eval_tasks,
            adapter=str(adapter),
            temperature=cfg.temperature,
            seed=cfg.seed,
        )
        return {"kind": "eval", "iteration": it, "env": cfg.eval_env, **result.summary}

    def checkpoint(self, it: int, best: bool = False) -> None:
        state = {
            "control": self.control.state_dict(),
            "metrics_rows": self.logger.rows,
            "cumulative_entropy": self.cumulative_entropy,
            "bad_steps": self.bad_steps,
            "best": self.best,
            "algo": self.algo.name,
        }
        save_checkpoint(
            self.run_dir,
            it,
            model=self.policy,
            optimizer=self.optimizer,
            scaler=self.scaler,
            state=state,
            base_model=self.cfg.model,
            best=best,
        )

    def close(self) -> None:
        self.logger.close()
        self.engine.close()


def _success_rate(episodes: list[Episode]) -> float:
    return sum(bool(e.info.get("success", e.reward >= 1.0)) for e in episodes) / len(episodes)


def _summary_line(row: dict[str, Any]) -> str:
    zeta = "" if row.get("zeta") is None else f" zeta={row['zeta']:.2g}"
    eps = "" if row.get("eps_high") is None else f" eps_high={row['eps_high']:.3g}"
    return (
        f"[{row['algo']}] iter {row['iteration']}: reward={row['reward_mean']:.3f} "
        f"entropy={row['entropy']:.4f} clip_low={row.get('clip_frac_low', 0):.3f} "
        f"clip_high={row.get('clip_frac_high', 0):.3f}{zeta}{eps} "
        f"rollout={row['rollout_s']:.1f}s update={row['update_s']:.1f}s"
    )


def train(cfg: TrainConfig) -> Path:
    """Run ``cfg`` to the end; returns the run folder."""
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return trainer.run_dir
