"""The RL training recipe: collect -> update (rescoring in fp32) -> hand the adapter over.

Read ``Trainer.iteration`` top to bottom: it is the paper's loop (appendix "Training") and holds
no math of its own; every formula is a named function in ``entrogym.algos``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import Engine, SamplingParams, make_engine
from entrogym.agents.env_workers import check_portable, shared_env_workers
from entrogym.agents.rollout import (
    EnvErrorBudgetExceeded,
    RolloutsInterrupted,
    check_env_errors,
    collect_rollouts,
)
from entrogym.algos import EntropyControl, UpdateBatch, micro_batches, policy_update
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train import distributed
from entrogym.train.batch import Batch, collate_episodes, success_rate, usable_episodes
from entrogym.train.checkpoint import (
    CheckpointWarning,
    intact_checkpoints,
    latest_checkpoint,
    load_adapter_into,
    load_checkpoint,
    read_meta,
    read_training_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from entrogym.train.config import TrainConfig
from entrogym.train.evaluation import EvalPlan, plan_evaluation, run_evaluation
from entrogym.train.logprobs import sequence_logprobs, sequence_logprobs_and_entropy
from entrogym.train.metrics import MetricsLogger, progress, summary_line
from entrogym.train.mismatch import sampler_entropy_gap, sampler_mismatch
from entrogym.train.phases import PhaseClock, PhaseHook
from entrogym.train.policy import LoraSettings, load_policy, save_adapter, trainable_parameters
from entrogym.train.precision import apply_threads, loss_scaler_for, resolve_dtype
from entrogym.train.run_folder import (
    NothingToDo,
    RunFileError,
    RunFolder,
    adapter_folder,
    open_run_folder,
    prune_adapters,
    write_error,
)
from entrogym.train.shutdown import Interrupted, ShutdownRequest
from entrogym.train.state import TrainState
from entrogym.train.trackers import Trackers, parse_report_to


class TrainingStopped(RuntimeError):
    """Raised when the run cannot go on (too many non-finite steps)."""


class Trainer:
    """One run. Under ``torchrun`` every rank builds one; rank 0 alone runs the rollout engine,
    evaluates and writes files, and the policy is FSDP2-sharded over the ranks
    (``entrogym.train.distributed`` explains the split)."""

    def __init__(
        self, cfg: TrainConfig, engine: Engine | None = None, hooks: tuple[PhaseHook, ...] = ()
    ) -> None:
        """``engine``: a running rollout engine to share (its owner closes it); by default the
        trainer starts the one ``cfg`` names and closes it at the end. ``hooks`` watch the
        phases of every iteration (``entrogym.train.phases``).

        Setup runs in small steps; the run-folder checks and its lock come first, so a wrong
        ``--out`` or a second writer fails before any model loads."""
        self.cfg = cfg
        self.ranks = distributed.setup_ranks()
        self.run_dir = Path(cfg.out)
        self.folder: RunFolder | None = None
        self.logger: MetricsLogger | None = None
        self.engine, self._owns_engine = engine, engine is None
        self.phases = PhaseClock(hooks)
        self.shutdown = ShutdownRequest(cfg.shutdown_grace)  # armed by train() around fit()
        self.saved: int | None = None  # the iteration of the newest checkpoint on disk
        # envs run in worker processes shared by this process's runs (0: in this process)
        self.env_workers = shared_env_workers(cfg.env_limits()) if cfg.env_workers else 0
        self.algo = cfg.algorithm()  # a bad preset is a config error: before the folder
        self.tasks = self._task_ids()  # so is a split smaller than tasks_per_iter
        self.eval_plan = self._plan_evaluation()  # and a bad eval split or eval env
        resume_from = self._open_run_folder()
        try:
            self._setup(resume_from)
        except BaseException:
            self.close(barrier=False)
            raise

    def _setup(self, resume_from: Path | None) -> None:
        cfg = self.cfg
        self.state = TrainState(algo=self.algo.name)
        self.adapter: Path | None = None  # the current weights' adapter folder (engine input)
        self._grad_norms: list[float] = []  # this iteration's pre-clip norms, filled by step()
        _seed_everything(cfg.seed)
        if cfg.threads is not None:
            apply_threads(cfg.threads)
        self.policy = load_policy(
            cfg.model,
            dtype=cfg.dtype,
            lora=LoraSettings(
                cfg.lora_rank, cfg.lora_alpha, target_modules=cfg.lora_target_modules
            ),
            seed=cfg.seed,
            # a 16-bit body keeps an fp32 LM head over upcast hidden states (paper Sec. 4);
            # under torchrun FSDP2's output_dtype=float32 plays that part
            head_dtype="fp32" if cfg.dtype != "fp32" and not self.ranks.distributed else None,
        )
        self.scaler = loss_scaler_for(resolve_dtype(cfg.dtype))
        self.control = EntropyControl(self.algo)
        # Weights load into the whole model, before FSDP2 shards it; the optimizer must be
        # built on the sharded parameters, so its state is restored after.
        resume_from, resume_rows = self._restore_weights(resume_from)
        self._build_optimizer()
        self._build_agent()
        self._start_engine()  # engines may seed torch: before a resume restores the RNGs
        if resume_from is not None:
            self._restore_training_state(resume_from)
        if self.ranks.main:
            restart = self.folder.restart  # a run that stopped before its first checkpoint
            rows = 0 if restart else resume_rows
            self.logger = self._metrics_logger(rows, resumed=resume_from is not None)
            event = "restart" if restart else "start" if resume_from is None else "resume"
            self.folder.record(event, self.cfg.to_dict(), from_iteration=self.state.start)

    # ----- setup ----------------------------------------------------------------------------

    def _metrics_logger(self, resume_rows: int | None, resumed: bool) -> MetricsLogger:
        """metrics.jsonl, TensorBoard and the other trackers of ``--report-to``."""
        names = parse_report_to(self.cfg.report_to)
        trackers = Trackers(names, self.run_dir, self.cfg.to_dict(), resume=resumed)
        return MetricsLogger(self.run_dir, resume_rows=resume_rows,
                             tensorboard="tensorboard" in names, trackers=trackers)  # fmt: skip

    def _open_run_folder(self) -> Path | None:
        """Rank 0: check ``--out`` (a run of this experiment, or new), take its lock, and find
        the checkpoint to resume. Raises NothingToDo when that checkpoint already covers
        ``iterations``. Every rank gets the checkpoint path (shared filesystem)."""

        def open_folder() -> tuple[str, str | None]:
            self.folder = open_run_folder(self.run_dir, self.cfg.to_dict(), resume=self.cfg.resume)
            try:
                ckpt = latest_checkpoint(self.run_dir) if self.cfg.resume else None
            except BaseException:
                self.folder.release()
                raise
            if ckpt is not None and read_meta(ckpt)["iteration"] + 1 >= self.cfg.iterations:
                self.folder.release()
                return "done", (
                    f"entrogym train: {self.run_dir} already has checkpoint {ckpt.name}, which "
                    f"covers iterations={self.cfg.iterations}; nothing to do (pass a larger "
                    "--iterations to train on)"
                )
            return "resume", None if ckpt is None else str(ckpt)

        # Every rank learns the outcome, so a torchrun group stops together.
        outcome, value = distributed.on_main(open_folder, self.ranks)
        if outcome == "done":
            raise NothingToDo(value)
        return None if value is None else Path(value)

    def _task_ids(self) -> list[str]:
        if self.cfg.env_workers:
            check_portable(self.cfg.env)  # before any model loads
        env = make_text_env(self.cfg.env, **self.cfg.env_kwargs)
        tasks = task_ids_of(env, self.cfg.split)
        env.close()
        if not tasks:
            raise ValueError(f"env {self.cfg.env!r} has no tasks in split {self.cfg.split!r}")
        if self.cfg.tasks_per_iter > len(tasks):
            raise ValueError(
                f"tasks_per_iter ({self.cfg.tasks_per_iter}) is above the {len(tasks)} tasks of "
                f"split {self.cfg.split!r} of {self.cfg.env}; an iteration draws distinct tasks, "
                f"so pass --tasks-per-iter {len(tasks)} or less (or more --samples per task)"
            )
        return tasks

    def _plan_evaluation(self) -> EvalPlan | None:
        cfg = self.cfg
        if not (cfg.eval_env and cfg.eval_every):
            return None
        # the eval env's own turn-budget rule if it declares one, else the run's
        return plan_evaluation(cfg.eval_env, cfg.eval_env_kwargs, split=cfg.eval_split,
                               max_tasks=cfg.eval_tasks, samples=cfg.eval_samples,
                               default_rule=cfg.on_turn_budget)  # fmt: skip

    def _build_optimizer(self) -> None:
        if self.ranks.distributed:
            from entrogym.train.fsdp import shard_policy

            shard_policy(self.policy, param_dtype=self.cfg.dtype)
        self.optimizer = torch.optim.AdamW(
            trainable_parameters(self.policy), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )

    def _build_agent(self) -> None:
        cfg = self.cfg
        self.agent = LLMAgent.from_model(
            cfg.model,
            system_prompt=cfg.system_prompt,
            max_turn_tokens=cfg.max_response_tokens,
            max_context=cfg.max_context_tokens,
            on_turn_budget=cfg.on_turn_budget,
            chat_template=cfg.chat_template,
        )
        self.pad_id = self.agent.tokenizer.pad_token_id or 0
        self.logprob_opts = {
            "softmax_fix": cfg.softmax_fix,
            "bf16_round_logprobs": cfg.bf16_round_logprobs,
        }

    def _start_engine(self) -> None:
        cfg = self.cfg
        if self.ranks.main and self.engine is None:
            self.engine = make_engine(
                cfg.engine,
                cfg.model,
                # the rollout batch sizes a vLLM engine's KV cache; threads bind its worker
                **cfg.engine_kwargs(
                    seed=cfg.seed,
                    lora_rank=cfg.lora_rank,
                    max_num_seqs=cfg.tasks_per_iter * cfg.samples,
                    threads=cfg.threads,
                ),
            )

    def _restore_weights(self, newest: Path | None) -> tuple[Path | None, int | None]:
        """Load --init-adapter, or the weights and trainer state of the newest checkpoint that
        loads (--resume; a damaged one falls back to the one before, with a warning). Returns
        that checkpoint (None if none) and the number of metrics rows to keep (None = fresh)."""
        if self.cfg.init_adapter:
            load_adapter_into(self.policy, self.cfg.init_adapter, base_model=self.cfg.model)
        if not self.cfg.resume:
            return None, None
        for ckpt in _newest_first(self.run_dir, newest):
            try:
                state = load_checkpoint(
                    ckpt,
                    model=self.policy,
                    scaler=self.scaler,
                    base_model=self.cfg.model,
                    restore_rng=False,
                )
            except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
                # Checkpoints written before checksums existed are checked by size only.
                warnings.warn(f"ignoring checkpoint {ckpt}: {exc}", CheckpointWarning, 2)
                continue
            self.state = TrainState.from_dict(state)
            self.control.load_state_dict(self.state.control)
            self.saved = state["iteration"]
            self._say(
                f"entrogym train: resuming {self.run_dir} after iteration {state['iteration']}"
            )
            return ckpt, self.state.metrics_rows
        self._say(f"entrogym train: no checkpoint in {self.run_dir}; starting from scratch")
        return None, 0

    def _restore_training_state(self, ckpt: Path) -> None:
        saved = read_training_state(ckpt)
        distributed.load_optimizer_state(
            self.policy, self.optimizer, saved["optimizer"], self.ranks
        )
        set_rng_state(saved["rng"])

    def _say(self, message: str, **kwargs: Any) -> None:
        if self.ranks.main:
            print(message, flush=True, **kwargs)

    # ----- the loop -------------------------------------------------------------------------

    def fit(self) -> None:
        """Train to ``iterations``. Once ``self.shutdown`` saw SIGTERM / SIGINT (armed by
        :func:`train`), the iteration in progress is finished (an update) or abandoned
        (rollouts), a checkpoint of the last completed iteration is written, and
        :class:`~entrogym.train.shutdown.Interrupted` is raised."""
        cfg = self.cfg
        if self._policy_device().type == "cuda":  # phase timings wait for queued GPU work
            self.phases.sync = torch.cuda.synchronize
        self.publish_adapter(self.state.start)
        for it in progress(range(self.state.start, cfg.iterations), desc="iterations", unit="iter"):
            t0 = time.perf_counter()
            rng_at_start = rng_state()  # what a checkpoint of it - 1 holds
            try:
                row = self.iteration(it)
            except RolloutsInterrupted:  # nothing of iteration it was applied: save it - 1
                raise self._interrupted(it - 1, rng=rng_at_start) from None
            self.state.iteration = it
            try:
                with self.phases.time("publish"):
                    self.publish_adapter(it + 1)  # the updated weights: rollouts, eval, ckpt
            finally:  # the row is written even when the adapter could not be
                row["phases_s"] = self.phases.take()
                row["iteration_s"] = time.perf_counter() - t0
                self._log(row, it)
            self._say(summary_line(row))
            improved = False
            stopping = self._stop_requested()  # then an evaluation would only delay the stop
            if (
                cfg.eval_env
                and cfg.eval_every
                and not stopping
                and (it % cfg.eval_every == 0 or it == cfg.iterations - 1)
            ):
                eval_row = self.evaluate(it)
                self._log(eval_row, it)
                # an eval with env errors measured the env too: it never marks the best
                score = eval_row["pass@1"] if eval_row["env_errors"] == 0 else None
                improved = score is not None and score > self.state.best
                self.state.best = max(self.state.best, score) if improved else self.state.best
            if stopping or self._stop_requested():
                raise self._interrupted(it, best=improved)
            if (it + 1) % cfg.checkpoint_every == 0 or it == cfg.iterations - 1 or improved:
                self.checkpoint(it, best=improved)
            if self.state.bad_steps > cfg.max_bad_steps:
                raise TrainingStopped(
                    f"{self.state.bad_steps} optimizer steps were skipped for non-finite losses "
                    f"or gradients (max_bad_steps={cfg.max_bad_steps}); lower lr or use dtype fp32"
                )

    def _stop_requested(self) -> bool:
        """Whether a signal asked the run to stop (rank 0 decides for a torchrun group)."""
        return bool(distributed.on_main(self.shutdown.requested, self.ranks))

    def _interrupted(self, it: int, best: bool = False, rng: dict[str, Any] | None = None):
        """Checkpoint iteration ``it`` unless it is on disk already, and the exception that
        ends the run."""
        if it >= 0 and self.saved != it:
            self.checkpoint(it, best=best, rng=rng)
        return self.shutdown.interrupted(None if it < 0 else f"iter-{it:06d}")

    def _log(self, row: dict[str, Any] | None, it: int) -> None:
        if self.logger is not None and row is not None:
            self.logger.log(row, step=it)

    def publish_adapter(self, version: int) -> None:
        """Write the current weights as ``adapters/vNNNNNN`` (one folder per version: engines
        reload a new path) for the rollouts, evaluation and servers that follow, and drop the
        versions no engine reads any more (checkpoints hold their own copy)."""
        weights = distributed.gathered_adapter(self.policy, self.ranks)  # collective under torchrun
        folder = adapter_folder(self.run_dir, version)
        if self.ranks.main:
            try:
                save_adapter(self.policy, folder, weights)
                prune_adapters(self.run_dir, version)  # disk stays bounded however long the run
            except OSError as exc:
                raise write_error(exc, str(folder)) from exc
        self.adapter = folder

    def collect(self, it: int) -> tuple[Batch, dict[str, Any]]:
        """Rank 0: rollouts with the current adapter, as a batch plus the rollout statistics
        of the metrics row. Raises ``TrainingStopped`` when no usable episode came back."""
        cfg = self.cfg
        tasks = random.Random(cfg.seed * 1_000_003 + it).sample(self.tasks, cfg.tasks_per_iter)
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
            env_workers=self.env_workers,
            env_timeout=cfg.env_timeout,
            # under torchrun, rank 0 alone collects: a stop is only taken between iterations
            should_stop=None if self.ranks.distributed else self.shutdown.requested,
        )
        # An env that raises or breaks its contract fails its episode (logged once per message);
        # past the allowed share the run stops, naming the first failure.
        check_env_errors(list(rollouts), cfg.max_env_error_fraction)
        self.phases.add("generation", rollouts.stats["generate_s"])
        self.phases.add("env", rollouts.stats["env_s"])
        episodes = usable_episodes([e for e in rollouts if not e.failed])
        if not episodes:
            raise TrainingStopped(f"iteration {it}: no episode with action tokens came back")
        stats = {
            "success_rate": success_rate(episodes),
            "response_tokens_mean": sum(e.num_action_tokens for e in episodes) / len(episodes),
            "episodes": len(episodes),
            "env_errors": rollouts.stats["env_errors"],
            "rollout_s": time.perf_counter() - t0,
            "tokens_per_s": rollouts.stats["tokens_per_s"],
            "generated_tokens": rollouts.stats["generated_tokens"],
        }
        return collate_episodes(episodes, self.pad_id), stats

    def iteration(self, it: int) -> dict[str, Any]:
        cfg = self.cfg
        # 1. Rollouts (rank 0), broadcast to every rank of a torchrun learner.
        batch, rollout_stats = distributed.on_main(lambda: self.collect(it), self.ranks)

        # 2. The preset's update: advantages, entropy control, clipped loss, steps. The old
        #    log-probs are rescored here in fp32 (never the engine's): by the update itself,
        #    which reuses the on-policy first minibatch's scoring pass.
        entropy_check = self.sampler_entropy_check(batch) if cfg.sampler_entropy_check else {}
        t0 = time.perf_counter()
        self._grad_norms = []
        experience = UpdateBatch.build(
            self.algo.advantage,
            rewards=batch.rewards,
            group_ids=batch.group_ids,
            mask=batch.action_mask,
            lengths=batch.lengths,
        )
        metrics = policy_update(
            self.control,
            experience,
            score=lambda index, need: self.score(batch, index, need),
            backward=self.backward,
            step=self.step,
            zero_grad=lambda: self.optimizer.zero_grad(set_to_none=True),
            micro_batch_size=cfg.micro_batch_size,
            generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + it),
        )
        update_s = time.perf_counter() - t0
        mismatch = sampler_mismatch(
            experience.old_logprobs, batch.sampler_logprobs, batch.action_mask
        )
        self.state.bad_steps += metrics["skipped_steps"]
        self.state.cumulative_entropy += metrics["entropy"]
        n_groups = experience.n_groups
        if metrics["zero_adv_groups"] == n_groups:
            self._say(
                f"iteration {it}: all {n_groups} groups have equal rewards within the group; "
                "no policy-gradient signal this iteration",
                file=sys.stderr,
            )
        return {
            "iteration": it,
            "algo": self.algo.name,
            **metrics,
            "cumulative_entropy": self.state.cumulative_entropy,
            **rollout_stats,
            "learner_tokens": int(batch.lengths.sum()),
            "groups": n_groups,
            "sampler_mismatch": mismatch["mean_abs_diff"],
            "sampler_mismatch_max": mismatch["max_abs_diff"],
            "sampler_ratio_outside": mismatch["frac_ratio_outside"],
            "sampler_nonfinite": mismatch["sampler_nonfinite"],
            **entropy_check,
            "update_s": update_s,
            "grad_norm": sum(self._grad_norms) / max(len(self._grad_norms), 1),
            "learner_ranks": self.ranks.world,
        }

    def sampler_entropy_check(self, batch: Batch) -> dict[str, Any]:
        """Opt-in: did the engine draw from the policy? One extra no-grad pass for the exact
        entropies at the sampled positions (``sampler_entropy_gap``; |z| > 4 fails)."""
        logprobs, entropies = [], []
        with torch.no_grad():
            for index in micro_batches(torch.arange(len(batch)), self.cfg.micro_batch_size):
                lp, ent = self.score(batch, index, need_entropy=True)
                width = batch.action_mask.shape[1]
                logprobs.append(torch.nn.functional.pad(lp, (0, width - lp.shape[1])))
                entropies.append(torch.nn.functional.pad(ent, (0, width - ent.shape[1])))
        check = sampler_entropy_gap(torch.cat(logprobs), torch.cat(entropies), batch.action_mask)
        return {"sampler_entropy_gap": check["gap"], "sampler_entropy_z": check["z"]}

    # ----- pieces the update calls ----------------------------------------------------------

    def score(
        self, batch: Batch, index: torch.Tensor, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of rows ``index`` (one micro-batch of the
        update), ``[b, t]`` with ``t`` their longest row, under the caller's grad mode. Under
        torchrun each rank scores its share of the rows and the results are all-gathered."""
        phase = "forward" if torch.is_grad_enabled() else "scoring"
        with self.phases.time(phase, batch=batch, index=index):
            input_ids, attention_mask = batch.tokens(index)
            mine = distributed.rows_of_rank(len(index), self.ranks)
            fn = sequence_logprobs_and_entropy if need_entropy else sequence_logprobs
            # Only action positions enter the loss: the LM head runs there alone (exact, faster).
            heads = batch.actions(index)[mine] if self.cfg.action_only_head else None
            device = self._policy_device()  # rows follow a policy moved to a GPU
            out = fn(
                self.policy,
                input_ids[mine].to(device),
                attention_mask[mine].to(device),
                score_mask=None if heads is None else heads.to(device),
                layout=self.cfg.score_layout,
                **self.logprob_opts,
            )
            lp, ent = out if need_entropy else (out, None)
            # gathered on the policy's device (NCCL needs it), then back to the update's CPU
            lp = distributed.gather_rows(lp, len(index), self.ranks).cpu()
            if need_entropy:
                ent = distributed.gather_rows(ent, len(index), self.ranks).cpu()
        return lp, ent

    def _policy_device(self) -> torch.device:
        return next(self.policy.parameters()).device

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate one micro-batch's weighted loss (scaled for fp16)."""
        with self.phases.time("backward"):
            self.scaler.scale(loss).backward()

    def step(self) -> bool:
        """Unscale (fp16), clip and take one optimizer step; False when it was skipped for
        non-finite gradients. The update clears gradients before each minibatch."""
        with self.phases.time("optimizer"):
            return self._step()

    def _step(self) -> bool:
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
        return stepped

    def evaluate(self, it: int) -> dict[str, Any]:
        """Held-out evaluation of the weights after iteration ``it``'s update -- the weights a
        checkpoint of ``it`` holds (and the next iteration's rollouts use). Rank 0 evaluates;
        every rank gets the eval row."""
        cfg = self.cfg

        def run() -> dict[str, Any]:
            plan = self.eval_plan or self._plan_evaluation()
            result = run_evaluation(self.engine, self.agent, plan, samples=cfg.eval_samples,
                                    adapter=str(self.adapter), temperature=cfg.temperature,
                                    seed=cfg.seed, env_workers=self.env_workers,
                                    env_timeout=cfg.env_timeout)  # fmt: skip
            return {"kind": "eval", "iteration": it, "env": cfg.eval_env, **result.summary}

        return distributed.on_main(run, self.ranks)

    def checkpoint(self, it: int, best: bool = False, rng: dict[str, Any] | None = None) -> None:
        """Write checkpoint ``it`` (rank 0). ``rng``: the RNG states to store (default: now)."""
        gathered = {}
        if self.ranks.distributed:  # collectives: every rank takes part, rank 0 writes
            gathered = {
                "weights": distributed.gathered_adapter(self.policy, self.ranks),
                "optimizer_state": distributed.optimizer_state(
                    self.policy, self.optimizer, self.ranks
                ),
            }
        if not self.ranks.main:
            return
        self.state.control = self.control.state_dict()
        self.state.metrics_rows = self.logger.rows
        try:
            save_checkpoint(
                self.run_dir,
                it,
                model=self.policy,
                optimizer=self.optimizer,
                scaler=self.scaler,
                state=self.state.to_dict(),
                base_model=self.cfg.model,
                best=best,
                rng=rng,
                **gathered,
            )
        except OSError as exc:
            raise write_error(exc, str(self.run_dir / "checkpoints")) from exc
        self.saved = it

    def record_stop(self, exc: BaseException) -> None:
        """Append why the run stopped to the history (best effort: the error itself may be
        that the folder cannot be written)."""
        if self.folder is None or not self.ranks.main:
            return
        event = "interrupted" if isinstance(exc, Interrupted) else "stopped"
        with contextlib.suppress(RunFileError):
            self.folder.record_event(event, saved_iteration=self.saved, reason=str(exc))

    def close(self, barrier: bool = True) -> None:
        """Close the metrics, the engine this trainer started, and release the run folder.
        ``barrier=False`` after a failed setup, where other ranks may not get this far."""
        if self.logger is not None:
            self.logger.close()
        if self.engine is not None and self._owns_engine:
            self.engine.close()
            self.engine = None
        if self.folder is not None:
            self.folder.release()
        if barrier:
            distributed.barrier(self.ranks)


def _newest_first(run_dir: Path, newest: Path | None) -> Iterator[Path]:
    """``newest`` (already verified), then the older intact checkpoints, verified only if
    asked for (when loading ``newest`` fails)."""
    if newest is None:
        return
    yield newest
    yield from (c for c in intact_checkpoints(run_dir) if c.name < newest.name)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# What ends a run early with a one-line message (exit code 1 from the command).
STOPS = (TrainingStopped, EnvErrorBudgetExceeded, RunFileError)


def train(cfg: TrainConfig) -> Path:
    """Run ``cfg`` to the end; returns the run folder. A ``--resume`` whose checkpoints already
    cover ``iterations`` says "nothing to do" and changes nothing. A run that stops early
    (:data:`STOPS`, or :class:`~entrogym.train.shutdown.Interrupted` on a signal) records why
    in ``config_history.jsonl`` and raises."""
    try:
        trainer = Trainer(cfg)
    except NothingToDo as done:
        if not distributed.launched_by_torchrun() or int(os.environ.get("RANK", "0")) == 0:
            print(done, flush=True)
        return Path(cfg.out)
    try:
        with trainer.shutdown:  # SIGTERM / SIGINT: checkpoint, then Interrupted
            trainer.fit()
    except (*STOPS, Interrupted) as exc:
        trainer.record_stop(exc)
        raise
    finally:
        trainer.close()
        if trainer.ranks.distributed:
            torch.distributed.destroy_process_group()
    return trainer.run_dir
