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
from entrogym.agents.engines import Engine, SamplingParams, make_engine
from entrogym.agents.episode import Episode
from entrogym.agents.rollout import collect_rollouts
from entrogym.algos.buffer import Batch, EpisodeBuffer
from entrogym.algos.presets import get_algorithm
from entrogym.algos.update import EntropyControl, policy_update
from entrogym.atomic import atomic_write_text
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train import distributed as dd
from entrogym.train.checkpoint import (
    latest_checkpoint,
    load_adapter_into,
    load_checkpoint,
    read_training_state,
    save_checkpoint,
    set_rng_state,
)
from entrogym.train.config import TrainConfig
from entrogym.train.evaluation import evaluate_policy
from entrogym.train.logprobs import sequence_logprobs, sequence_logprobs_and_entropy
from entrogym.train.metrics import MetricsLogger, progress
from entrogym.train.mismatch import sampler_mismatch
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
    """One run. Under ``torchrun`` every rank builds one; rank 0 alone runs the rollout engine,
    evaluates and writes files, and the policy is FSDP2-sharded over the ranks
    (``entrogym.train.distributed`` explains the split)."""

    def __init__(self, cfg: TrainConfig, engine: Engine | None = None) -> None:
        """``engine``: a running rollout engine to share (its owner closes it); by default the
        trainer starts the one ``cfg`` names and closes it at the end."""
        self.cfg = cfg
        self.ranks = dd.setup_ranks()
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
        self.scaler = loss_scaler_for(resolve_dtype(cfg.dtype))
        self.control = EntropyControl(self.algo)
        self.start, self.cumulative_entropy, self.bad_steps, self.best = 0, 0.0, 0, -1.0
        self.adapter: Path | None = None  # the current weights' adapter folder (engine input)
        self._grad_norms: list[float] = []  # this iteration's pre-clip norms, filled by step()
        # Weights load into the whole model, before FSDP2 shards it; the optimizer must be
        # built on the sharded parameters, so its state is restored after.
        resume_from, resume_rows = self._restore_weights()
        if self.ranks.distributed:
            from entrogym.train.fsdp import shard_policy

            shard_policy(self.policy, param_dtype=cfg.dtype)
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
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
        self.engine, self._owns_engine = engine, engine is None
        if self.ranks.main and engine is None:
            self.engine = make_engine(
                cfg.engine,
                cfg.model,
                dtype=cfg.engine_dtype,
                max_model_len=cfg.max_context_tokens,
                urls=cfg.engine_urls or None,
                seed=cfg.seed,
            )
        if resume_from is not None:
            self._restore_training_state(resume_from)
        self.logger = None
        if self.ranks.main:
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

    def _restore_weights(self) -> tuple[Path | None, int | None]:
        """Load --init-adapter, or the weights and trainer state of the latest complete
        checkpoint (--resume). Returns that checkpoint (None if none) and the number of metrics
        rows to keep (None = fresh run)."""
        if self.cfg.init_adapter:
            load_adapter_into(self.policy, self.cfg.init_adapter, base_model=self.cfg.model)
        if not self.cfg.resume:
            return None, None
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            self._say(f"entrogym train: no checkpoint in {self.run_dir}; starting from scratch")
            return None, 0
        state = load_checkpoint(
            ckpt,
            model=self.policy,
            scaler=self.scaler,
            base_model=self.cfg.model,
            restore_rng=False,
        )
        self.control.load_state_dict(state["control"])
        self.start = state["iteration"] + 1
        self.cumulative_entropy = state["cumulative_entropy"]
        self.bad_steps, self.best = state["bad_steps"], state["best"]
        self._say(f"entrogym train: resuming {self.run_dir} after iteration {state['iteration']}")
        return ckpt, state["metrics_rows"]

    def _restore_training_state(self, ckpt: Path) -> None:
        saved = read_training_state(ckpt)
        dd.load_optimizer_state(self.policy, self.optimizer, saved["optimizer"], self.ranks)
        set_rng_state(saved["rng"])

    def _say(self, message: str, **kwargs: Any) -> None:
        if self.ranks.main:
            print(message, flush=True, **kwargs)

    # ----- the loop -------------------------------------------------------------------------

    def fit(self) -> None:
        cfg = self.cfg
        self.publish_adapter(self.start)
        for it in progress(range(self.start, cfg.iterations), desc="iterations", unit="iter"):
            row = self.iteration(it)
            self.publish_adapter(it + 1)  # the updated weights: next rollouts, eval, checkpoint
            self._log(row, it)
            self._say(_summary_line(row))
            improved = False
            if (
                cfg.eval_env
                and cfg.eval_every
                and (it % cfg.eval_every == 0 or it == cfg.iterations - 1)
            ):
                eval_row = self.evaluate(it)
                self._log(eval_row, it)
                improved = eval_row["pass@1"] > self.best
                self.best = max(self.best, eval_row["pass@1"])
            if (it + 1) % cfg.checkpoint_every == 0 or it == cfg.iterations - 1 or improved:
                self.checkpoint(it, best=improved)
            if self.bad_steps > cfg.max_bad_steps:
                raise TrainingStopped(
                    f"{self.bad_steps} optimizer steps were skipped for non-finite losses or "
                    f"gradients (max_bad_steps={cfg.max_bad_steps}); lower lr or use dtype fp32"
                )

    def _log(self, row: dict[str, Any] | None, it: int) -> None:
        if self.logger is not None and row is not None:
            self.logger.log(row, step=it)

    def publish_adapter(self, version: int) -> None:
        """Write the current weights as ``adapters/vNNNNNN`` (one folder per version: engines
        reload a new path) for the rollouts, evaluation and servers that follow."""
        weights = dd.gathered_adapter(self.policy, self.ranks)  # collective under torchrun
        folder = self.run_dir / "adapters" / f"v{version:06d}"
        if self.ranks.main:
            save_adapter(self.policy, folder, weights)
        self.adapter = folder

    def collect(self, it: int) -> tuple[Batch, dict[str, Any]] | str:
        """Rank 0: rollouts with the current adapter, as a batch plus the rollout statistics
        of the metrics row; or the reason there is none."""
        cfg = self.cfg
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
            adapter=str(self.adapter),
            min_done_per_task=cfg.early_stop_min_per_task,
            min_done_fraction=cfg.early_stop_fraction,
            env_kwargs=cfg.env_kwargs,
            seed=cfg.seed * 1_000_003 + it * len(tasks) * cfg.samples,
        )
        episodes = usable_episodes(list(rollouts))
        if not episodes:
            return f"iteration {it}: no episode with action tokens came back"
        stats = {
            "success_rate": _success_rate(episodes),
            "episodes": len(episodes),
            "rollout_s": time.perf_counter() - t0,
            "tokens_per_s": rollouts.stats["tokens_per_s"],
        }
        return EpisodeBuffer(self.pad_id, episodes).to_batch(), stats

    def iteration(self, it: int) -> dict[str, Any]:
        cfg = self.cfg
        # 1. Rollouts (rank 0), broadcast to every rank of a torchrun learner.
        collected = dd.on_main(lambda: self.collect(it), self.ranks)
        if isinstance(collected, str):
            raise TrainingStopped(collected)
        batch, rollout_stats = collected

        self._grad_norms = []
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
            self._say(
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
            "success_rate": rollout_stats["success_rate"],
            "response_tokens_mean": float(action_tokens.mean()),
            "episodes": rollout_stats["episodes"],
            "groups": n_groups,
            "sampler_mismatch": mismatch["mean_abs_diff"],
            "sampler_mismatch_max": mismatch["max_abs_diff"],
            "sampler_ratio_outside": mismatch["frac_ratio_outside"],
            "rollout_s": rollout_stats["rollout_s"],
            "update_s": update_s,
            "grad_norm": sum(self._grad_norms) / max(len(self._grad_norms), 1),
            "tokens_per_s": rollout_stats["tokens_per_s"],
            "learner_ranks": self.ranks.world,
        }

    # ----- pieces the update calls ----------------------------------------------------------

    def score(
        self, batch: Batch, index: torch.Tensor, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of rows ``index``, padded back to the batch's T.

        Runs in chunks of ``micro_batch_size`` under the caller's grad mode (the update passes
        micro-batches of exactly that size, so each backward sees one chunk). Under torchrun
        each rank scores its share of a chunk and the results are all-gathered."""
        rows = batch.select(index)
        fn = sequence_logprobs_and_entropy if need_entropy else sequence_logprobs
        lps, ents = [], []
        for s in range(0, len(rows), self.cfg.micro_batch_size):
            chunk = torch.arange(s, min(s + self.cfg.micro_batch_size, len(rows)))
            mine = dd.rows_of_rank(len(chunk), self.ranks)
            out = fn(
                self.policy,
                rows.input_ids[chunk[mine]],
                rows.attention_mask[chunk[mine]],
                **self.logprob_opts,
            )
            lp, ent = out if need_entropy else (out, None)
            lps.append(dd.gather_rows(lp, len(chunk), self.ranks))
            ents.append(dd.gather_rows(ent, len(chunk), self.ranks) if need_entropy else None)
        t = batch.input_ids.shape[1]
        lp = pad_to(torch.cat(lps), t)
        return lp, pad_to(torch.cat(ents), t) if need_entropy else None

    def step(self) -> bool:
        found_inf = self.scaler.unscale_(self.optimizer)
        if not found_inf:
            norm = torch.nn.utils.clip_grad_norm_(
                trainable_parameters(self.policy), self.cfg.max_grad_norm
            )
            self._grad_norms.append(
                float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            )
        stepped = self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    def evaluate(self, it: int) -> dict[str, Any]:
        """Held-out evaluation of the weights after iteration ``it``'s update -- the weights a
        checkpoint of ``it`` holds (and the next iteration's rollouts use). Rank 0 evaluates;
        every rank gets the eval row."""
        cfg = self.cfg

        def run() -> dict[str, Any]:
            result = evaluate_policy(
                self.engine,
                self.agent,
                cfg.eval_env,
                split=cfg.eval_split,
                samples=cfg.eval_samples,
                max_tasks=cfg.eval_tasks,
                adapter=str(self.adapter),
                temperature=cfg.temperature,
                seed=cfg.seed,
                env_kwargs=cfg.eval_env_kwargs,
            )
            return {"kind": "eval", "iteration": it, "env": cfg.eval_env, **result.summary}

        return dd.on_main(run, self.ranks)

    def checkpoint(self, it: int, best: bool = False) -> None:
        gathered = {}
        if self.ranks.distributed:  # collectives: every rank takes part, rank 0 writes
            gathered = {
                "weights": dd.gathered_adapter(self.policy, self.ranks),
                "optimizer_state": dd.optimizer_state(self.policy, self.optimizer, self.ranks),
            }
        if not self.ranks.main:
            return
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
            **gathered,
        )

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        if self.engine is not None and self._owns_engine:
            self.engine.close()
        dd.barrier(self.ranks)


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
        if trainer.ranks.distributed:
            torch.distributed.destroy_process_group()
    return trainer.run_dir
