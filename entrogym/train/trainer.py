"""The RL training recipe: collect -> update (rescoring in fp32) -> hand the adapter over.

Read ``Trainer.iteration`` top to bottom: it is the paper's loop (appendix "Training") and holds
no math of its own; every formula is a named function in ``entrogym.algos``. With
``max_staleness`` K >= 1 the collection of later iterations' rollouts runs beside the update
(``entrogym.train.pipeline``), and a stale batch is rescored under the weight version that
sampled it (``entrogym.train.versions``).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import Engine, SamplingParams, make_engine, resolve_engine_kind
from entrogym.agents.engines.shared_weights import frozen_base_tensors
from entrogym.agents.env_workers import check_portable, shared_env_workers
from entrogym.agents.rollout import (
    EnvErrorBudgetExceeded,
    RolloutsInterrupted,
    check_env_errors,
    collect_rollouts,
)
from entrogym.algos import EntropyControl, UpdateBatch, policy_update, sampled_entropy
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.train import distributed
from entrogym.train.batch import collate_episodes, success_rate, usable_episodes
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
from entrogym.train.pipeline import RolloutPipeline
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
from entrogym.train.versions import WeightVersions


class TrainingStopped(RuntimeError):
    """Raised when the run cannot go on (too many non-finite steps)."""


# The probe batches of a target (``Trainer._probe_target``) draw their tasks and seeds as these
# iterations would: far past any run's end, so never a draw the run trains on.
PROBE_ITERATION = 10**6


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
        self._engine_lock = threading.Lock()  # rollouts (maybe a thread) and eval take turns
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
        # the versions a stale batch may come from (K + 1 with the current one)
        self.versions = (
            WeightVersions(self.policy, keep=cfg.max_staleness + 1) if cfg.max_staleness else None
        )
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
                f"{self.cfg.env} (split {self.cfg.split or 'default'}); an iteration draws "
                "distinct tasks, "
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
                    max_loras=cfg.max_staleness + 1,  # the versions the run samples with
                ),
                **self._shared_base_weights(),
            )

    def _shared_base_weights(self) -> dict[str, Any]:
        """An in-process ``hf`` engine samples with the learner's frozen base weights (one
        copy in memory, not two; it loads its own where the dtypes differ). Not under torchrun,
        where FSDP2 has sharded them."""
        if resolve_engine_kind(self.cfg.engine) != "hf" or self.ranks.distributed:
            return {}
        return {"base_weights": frozen_base_tensors(self.policy)}

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
        if self.versions is not None and saved.get("sampler_weights"):
            self.versions.load({int(v): w for v, w in saved["sampler_weights"].items()})

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
        start = self.state.start
        self.publish_adapter(start)
        self._publish_older_versions(start)
        self._probe_target()
        pipeline = RolloutPipeline(
            self.collect,
            max_staleness=cfg.max_staleness,
            start=start,
            stop=cfg.iterations if self.ranks.main else start,  # rank 0 alone collects
            floor=min(self.versions.versions()) if self.versions is not None else start,
            on_thread_start=self._split_threads(),
        )
        with pipeline:
            for it in progress(range(start, cfg.iterations), desc="iterations", unit="iter"):
                self._fit_iteration(it, pipeline)

    def _fit_iteration(self, it: int, pipeline: RolloutPipeline) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        rng_at_start = rng_state()  # what a checkpoint of it - 1 holds
        try:
            collected = distributed.on_main(lambda: pipeline.get(it), self.ranks)
            row = self.iteration(it, collected)
        except RolloutsInterrupted:  # nothing of iteration it was applied: save it - 1
            raise self._interrupted(it - 1, rng=rng_at_start) from None
        self.state.iteration = it
        try:
            with self.phases.time("publish"):
                self.publish_adapter(it + 1)  # the updated weights: rollouts, eval, checkpoint
            pipeline.published(it + 1)
        finally:  # the row is written even when the adapter could not be
            row["phases_s"] = self.phases.take()
            row["iteration_s"] = time.perf_counter() - t0
            row["rollout_wait_s"] = pipeline.wait_s
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
        versions no engine reads any more (checkpoints hold their own copy). With
        ``max_staleness`` K the K versions before stay, and the learner keeps their weights."""
        weights = distributed.gathered_adapter(self.policy, self.ranks)  # collective under torchrun
        folder = adapter_folder(self.run_dir, version)
        if self.versions is not None:
            self.versions.record(version)
        if self.ranks.main:
            try:
                save_adapter(self.policy, folder, weights)
                # disk stays bounded however long the run: the sampling versions and one before
                prune_adapters(self.run_dir, version, keep=self.cfg.max_staleness + 2)
            except OSError as exc:
                raise write_error(exc, str(folder)) from exc
        self.adapter = folder

    def _publish_older_versions(self, start: int) -> None:
        """A resumed async run: the adapter folders of the versions its next batches are
        sampled by, from the weights its checkpoint kept."""
        if self.versions is None:
            return
        older = [v for v in self.versions.versions() if v < start]
        for version, weights in self.versions.full(older).items():  # collective under torchrun
            if self.ranks.main:
                save_adapter(self.policy, adapter_folder(self.run_dir, version), weights)

    def _split_threads(self) -> Any:
        """With rollouts beside the update and the engine in this process (``hf``), the two
        share the cores: the learner keeps ``threads`` (default: half the cores) and the
        rollout thread takes the rest (at least one). Returns the rollout thread's setup."""
        if not self.cfg.max_staleness or getattr(self.engine, "kind", None) != "hf":
            return None
        cores = os.cpu_count() or 1
        learner = self.cfg.threads or max(1, cores // 2)
        torch.set_num_threads(learner)  # this thread's (the learner's) OpenMP team
        engine = max(1, cores - learner)
        return lambda: torch.set_num_threads(engine)

    def collect(
        self, it: int, version: int | None = None, adapter: Path | None = None
    ) -> tuple[UpdateBatch, dict[str, Any]]:
        """Rank 0: iteration ``it``'s rollouts, sampled by weight ``version`` (default ``it``,
        the current weights; from the folder ``adapter`` if given, else its own), as a batch
        plus the rollout statistics of the metrics row. Safe
        to run in the rollout thread. Raises ``TrainingStopped`` when no usable episode came
        back."""
        cfg = self.cfg
        version = it if version is None else version
        tasks = random.Random(cfg.seed * 1_000_003 + it).sample(self.tasks, cfg.tasks_per_iter)
        t0 = time.perf_counter()
        # In an async run each batch samples from its own stream, whenever the thread gets to it.
        stream = self.engine.seeded(cfg.seed * 1_000_003 + it) if cfg.max_staleness else None
        with self._engine_lock, stream or contextlib.nullcontext():
            rollouts = collect_rollouts(
                cfg.env,
                tasks,
                self.engine,
                self.agent,
                k=cfg.samples,
                sampling=SamplingParams(temperature=cfg.temperature, ignore_eos=cfg.ignore_eos),
                adapter=str(adapter or adapter_folder(self.run_dir, version)),
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
        for episode in rollouts:
            episode.info["policy_version"] = version
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
            "policy_version": version,
            "generate_s": rollouts.stats["generate_s"],  # charged to the phases by iteration()
            "env_s": rollouts.stats["env_s"],
        }
        return collate_episodes(episodes, self.pad_id), stats

    def iteration(
        self, it: int, collected: tuple[UpdateBatch, dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        cfg = self.cfg
        # 1. Rollouts (rank 0), broadcast to every rank of a torchrun learner; ``fit`` hands
        #    them over from its rollout pipeline.
        if collected is None:
            collected = distributed.on_main(lambda: self.collect(it), self.ranks)
        batch, rollout_stats = collected[0], dict(collected[1])
        self.phases.add("generation", rollout_stats.pop("generate_s"))
        self.phases.add("env", rollout_stats.pop("env_s"))
        staleness = it - batch.versions

        # 2. The preset's update: advantages, entropy control, clipped loss, steps. The old
        #    log-probs are rescored here in fp32 (never the engine's): by the update itself,
        #    which reuses the on-policy first minibatch's scoring pass, or, for a stale batch,
        #    under the weights of the version that sampled it.
        entropy_check = self.sampler_entropy_check(batch) if cfg.sampler_entropy_check else {}
        t0 = time.perf_counter()
        self._grad_norms = []
        batch.compute_advantages(self.algo.advantage)
        if bool((staleness > 0).any()):  # the ratio's denominator: the policy that sampled
            batch.old_logprobs = self.sampling_version_logprobs(batch, it)
        metrics = policy_update(
            self.control,
            batch,
            score=lambda index, need: self.score(batch, index, need),
            backward=self.backward,
            step=self.step,
            zero_grad=lambda: self.optimizer.zero_grad(set_to_none=True),
            micro_batch_size=cfg.micro_batch_size,
            generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + it),
            version=it,
            micro_batch_tokens=cfg.micro_batch_tokens,
        )
        update_s = time.perf_counter() - t0
        mismatch = sampler_mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.mask)
        self.state.bad_steps += metrics["skipped_steps"]
        self.state.cumulative_entropy += metrics["entropy"]
        n_groups = batch.n_groups
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
            "staleness_mean": float(staleness.float().mean()),
            "staleness_max": int(staleness.max()),
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

    def sampling_version_logprobs(self, batch: UpdateBatch, it: int) -> torch.Tensor:
        """fp32 log-probs ``[B, T]`` of every row under the weight version that sampled it
        (``batch.versions``; the current weights are version ``it``): the ratio's denominator
        for a stale batch, scored exactly as the update scores its own rows."""
        out = torch.zeros(batch.mask.shape)
        for version in sorted(set(batch.versions.tolist())):
            rows = (batch.versions == version).nonzero().flatten()
            weights = (
                contextlib.nullcontext() if version == it else self.versions.weights_of(version)
            )  # type: ignore[union-attr]
            with weights, torch.no_grad():
                for index in self._micro_batches(batch, rows):
                    lp, _ = self.score(batch, index, need_entropy=False)
                    out[index, : lp.shape[1]] = lp
        return out

    def _micro_batches(self, batch: UpdateBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        return batch.micro_batches(rows, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)

    def _probe_target(self) -> None:
        """``algo.controller.target_probe`` batches sampled from the initial policy before the
        first update, scored in fp32 like an iteration's batch; their sampled entropies go into
        the controller's target. Their tasks and seeds are drawn as iterations past any run's
        end would draw them (``PROBE_ITERATION`` on), so never as a training iteration's. With
        the ``hf`` engine they leave the run's own samples as they would be without them: the
        engine samples them in a seeded scope from a copy of the initial adapter, so neither
        its random stream nor the set of adapters it holds is changed for the run."""
        n = self.control.probe_batches
        if not n:
            return
        t0 = time.perf_counter()
        entropies = []
        for batch in distributed.on_main(lambda: self._collect_probe(n), self.ranks):
            with torch.no_grad():
                logprobs, _ = self._score_all(batch, need_entropy=False)
            entropies.append(sampled_entropy(logprobs, batch.mask))
        self.control.observe_probe(entropies)
        listed = ", ".join(f"{h:.3f}" for h in entropies)
        self._say(f"target probe: {n} batches of the initial policy, entropy {listed} nats "
                  f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip

    def _collect_probe(self, n: int) -> list[UpdateBatch]:
        start = self.state.start
        with tempfile.TemporaryDirectory(prefix="entrogym-probe-") as tmp:
            copy = shutil.copytree(adapter_folder(self.run_dir, start), Path(tmp) / "adapter")
            batches = []
            for it in range(PROBE_ITERATION + 1, PROBE_ITERATION + n + 1):
                with self.engine.seeded(self.cfg.seed * 1_000_003 + it):
                    batches.append(self.collect(it, version=start, adapter=copy)[0])
        return batches

    def _score_all(
        self, batch: UpdateBatch, need_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-probs (and exact entropies) of every row, ``[B, T]`` like ``batch.mask``."""
        width = batch.mask.shape[1]
        logprobs, entropies = [], []
        for index in self._micro_batches(batch, torch.arange(len(batch))):
            lp, ent = self.score(batch, index, need_entropy=need_entropy)
            logprobs.append(torch.nn.functional.pad(lp, (0, width - lp.shape[1])))
            if ent is not None:
                entropies.append(torch.nn.functional.pad(ent, (0, width - ent.shape[1])))
        return torch.cat(logprobs), torch.cat(entropies) if entropies else None

    def sampler_entropy_check(self, batch: UpdateBatch) -> dict[str, Any]:
        """Opt-in: did the engine draw from the policy? One extra no-grad pass for the exact
        entropies at the sampled positions (``sampler_entropy_gap``; |z| > 4 fails)."""
        with torch.no_grad():
            logprobs, entropies = self._score_all(batch, need_entropy=True)
        check = sampler_entropy_gap(logprobs, entropies, batch.mask)
        return {"sampler_entropy_gap": check["gap"], "sampler_entropy_z": check["z"]}

    # ----- pieces the update calls ----------------------------------------------------------

    def score(
        self, batch: UpdateBatch, index: torch.Tensor, need_entropy: bool
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
            with self._engine_lock:  # the rollout thread and evaluation take turns
                plan = self.eval_plan or self._plan_evaluation()
                result = run_evaluation(self.engine, self.agent, plan, samples=cfg.eval_samples,
                                        adapter=str(self.adapter), temperature=cfg.temperature,
                                        seed=cfg.seed, env_workers=self.env_workers,
                                        env_timeout=cfg.env_timeout)  # fmt: skip
            return {"kind": "eval", "iteration": it, "env": cfg.eval_env, **result.summary}

        return distributed.on_main(run, self.ranks)

    def checkpoint(self, it: int, best: bool = False, rng: dict[str, Any] | None = None) -> None:
        """Write checkpoint ``it`` (rank 0). ``rng``: the RNG states to store (default: now)."""
        # the weights of the versions the next batches were sampled by (async): collective
        older = [v for v in self.versions.versions() if v <= it] if self.versions else []
        sampler_weights = self.versions.full(older) if self.versions else None
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
                sampler_weights=sampler_weights,
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
