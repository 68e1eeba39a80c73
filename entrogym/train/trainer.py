"""The RL training recipe: collect -> advantages -> update (rescoring in fp32) -> publish.

Read :class:`Trainer` top to bottom: setup, then ``iteration`` (the paper's loop, appendix
"Training"), then the checkpoint. It holds no math of its own (every formula is a named function
in ``entrogym.algos``) and little state: it drives three parts, each owning one concern, and
one hook:

- ``run`` (:class:`~entrogym.train.run.Run`): the run folder, its lock, resume, checkpoints,
  metrics, trackers and the config history;
- ``sampler`` (:class:`~entrogym.train.sampler.engine.Sampler`): the rollout engine, the adapters
  it samples with and the kept weight versions (``entrogym.train.sampler.adapters``), rollouts
  (ahead of the update with ``max_staleness`` K >= 1: ``entrogym.train.sampler.pipeline``) and
  evaluation;
- ``learner`` (:class:`~entrogym.train.learner.update.Learner`): the policy, optimizer and loss
  scaler, fp32 scoring and the update's steps;
- ``feed`` (:class:`~entrogym.train.control_feed.ControlFeed`): what the entropy control asks
  for beside the batch (the target probe, the probe states' or the base model's entropy,
  AEPO's samples at its temperature, the input dependence), called before the first update
  and before each.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.agents.engines import Engine
from entrogym.agents.rollout import EnvErrorBudgetExceeded, RolloutsInterrupted
from entrogym.algos import EntropyControl, UpdateBatch
from entrogym.algos.step_guard import NonFiniteSteps
from entrogym.train.config import TrainConfig
from entrogym.train.control_feed import PROBE_ITERATION, ControlFeed
from entrogym.train.devices import distributed
from entrogym.train.folder.adapter_files import NonFiniteWeights
from entrogym.train.folder.checkpoint import read_training_state, rng_state, set_rng_state
from entrogym.train.folder.metrics import summary_line
from entrogym.train.folder.safety import NothingToDo, RunFileError
from entrogym.train.folder.state import TrainState
from entrogym.train.folder.turn_metrics import entropy_by_turn
from entrogym.train.heap import HeapTrim
from entrogym.train.learner.mismatch import (
    UNMEASURED_MISMATCH,
    sampler_mismatch,
    sampler_scores_usable,
)
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock, PhaseHook
from entrogym.train.progress import progress
from entrogym.train.run import Run
from entrogym.train.sampler.engine import Sampler, TrainingStopped
from entrogym.train.sampler.pipeline import RolloutPipeline
from entrogym.train.shutdown import Interrupted, ShutdownRequest, StopNow

__all__ = ["PROBE_ITERATION", "STOPS", "Trainer", "TrainingStopped", "train"]


class Trainer:
    """One run. Under ``torchrun`` every rank builds one; rank 0 alone runs the rollout engine,
    evaluates and writes files, and the policy is FSDP2-sharded over the ranks
    (``entrogym.train.devices.distributed`` explains the split)."""

    def __init__(
        self,
        cfg: TrainConfig,
        engine: Engine | None = None,
        hooks: tuple[PhaseHook, ...] = (),
        shutdown: ShutdownRequest | None = None,
    ) -> None:
        """``engine``: a running rollout engine to share (its owner closes it); by default the
        sampler starts the one ``cfg`` names and closes it at the end. ``hooks`` watch the
        phases of every iteration (``entrogym.train.phases``). ``shutdown``: the signal
        handlers that stop the run (:func:`train` arms them from start-up on).

        The config checked its own values when it was made, and ``entrogym train`` checks
        what needs files or the env registry (``init_adapter`` included) before it builds a
        trainer (:mod:`entrogym.commands.preflight`). Here the run-folder checks and its lock
        come before the model, so a second writer fails before any model loads."""
        self.cfg = cfg
        self.ranks = distributed.setup_ranks()
        self.phases = PhaseClock((*hooks, HeapTrim()) if cfg.trim_heap else hooks)
        self.shutdown = shutdown or ShutdownRequest(cfg.shutdown_grace)
        self.algo = cfg.algo
        self.sampler = Sampler(cfg, self.ranks, self.shutdown, engine)  # checks split, eval env
        self.run = Run(cfg, self.ranks)
        resume_from = self.run.open()
        try:
            self._setup(resume_from)
        except BaseException:
            self.close(barrier=False)
            raise

    def _setup(self, resume_from: Path | None) -> None:
        self.state = TrainState(algo=self.algo.name)
        _seed_everything(self.cfg.seed)
        self.learner = Learner(self.cfg, self.ranks, self.phases)
        self.control = EntropyControl(self.algo)
        # Weights load into the whole model, before FSDP2 shards it; the optimizer must be
        # built on the sharded parameters, so its state is restored after.
        resumed = self.run.load_weights(resume_from, self.learner.policy, self.learner.scaler)
        if resumed is not None:
            self.state = resumed
            self.control.load_state_dict(resumed.control)
        self.learner.build_optimizer()
        self.sampler.start(self.learner.policy)  # engines may seed torch: before the RNGs
        if self.run.resumed_from is not None:
            saved = read_training_state(self.run.resumed_from)
            self.learner.load_optimizer_state(saved["optimizer"])
            set_rng_state(saved["rng"])
            self.sampler.adapters.load(saved.get("sampler_weights"))
        # the entropy control's own samples and measurements (after a resume restored the state)
        self.feed = ControlFeed(self.control, self.sampler, self.learner, self.ranks, self.phases,
                                self.state)  # fmt: skip
        if self.ranks.main:
            self.run.start_logging(from_iteration=self.state.start)

    # ----- the loop -------------------------------------------------------------------------

    def fit(self) -> None:
        """Train to ``iterations``. Once ``self.shutdown`` saw SIGTERM / SIGINT (armed by
        :func:`train`), the iteration in progress is finished (an update) or abandoned
        (rollouts), a checkpoint of the last completed iteration is written, and
        :class:`~entrogym.train.shutdown.Interrupted` is raised."""
        if self.learner.device.type == "cuda":  # phase timings wait for queued GPU work
            self.phases.sync = torch.cuda.synchronize
        start = self.state.start
        if self._stop_requested():  # a signal during start-up: nothing new to save
            raise self._interrupted(start - 1)
        self.sampler.publish_adapter(start)
        self.sampler.adapters.publish_older(start)
        if self.state.evaluation_owed:  # the weights a stop left unevaluated (published now)
            self._evaluate_owed(start - 1)
        probed = self.feed.start(start)  # the target probe, on a fresh run that asks for one
        if probed:
            self.run.say(probed)
        with self.sampler.pipeline(start, self.cfg.iterations, self.phases) as pipeline:
            iterations = range(start, self.cfg.iterations)
            for it in progress(iterations, desc="iterations", unit="iter", enabled=self.ranks.main):
                row = self.iteration(it, pipeline=pipeline)
                self._evaluate_and_save(it, row)

    def iteration(
        self, it: int, collected: tuple[UpdateBatch, dict[str, Any]] | None = None,
        pipeline: RolloutPipeline | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Iteration ``it`` on the weights of version ``it``: collect -> advantages -> update ->
        publish version ``it + 1``. Returns its metrics row, written to the run even when the
        adapter could not be published. ``collected``: the batch when it was sampled already;
        else it comes from ``pipeline`` (``fit``'s) or is sampled now."""
        t0, rng_at_start = time.perf_counter(), rng_state()  # what a checkpoint of it - 1 holds
        # 1. Collect: the batch (rank 0, broadcast to a torchrun learner), then what the entropy
        #    control asks for beside it (``self.feed``).
        with self._stop_before_update(it, rng_at_start, failed_rollouts=True):
            if collected is None:
                collected = distributed.on_main(lambda: self._sample(it, pipeline), self.ranks)
        batch, stats = self._received(collected)
        with self._stop_before_update(it, rng_at_start):  # the aepo lever's samples
            stats |= self.feed.before_update(it, batch)
        if not self.cfg.max_staleness:  # no rollouts beside the update, and the next ones
            self.sampler.release_engine_caches()  # sample a new version: its memory is free
        checks = self.learner.entropy_check(batch)  # --sampler-entropy-check only
        # 2. Advantages, and the ratio's denominator where the update does not rescore it in
        #    fp32 itself: the engine's log-probs, or a stale batch's under its sampling versions.
        t_update = time.perf_counter()
        batch.compute_advantages(self.algo.advantage)
        from_sampler = self._old_logprobs(batch, it, it - batch.versions)
        # 3. The preset's update: entropy control, clipped loss, optimizer steps.
        metrics = self.learner.update(self.control, batch, it)
        update_s = time.perf_counter() - t_update
        row = self._row(it, batch, metrics, stats, checks, from_sampler, update_s)
        # 4. Publish the weights the next rollouts, evaluation and checkpoint use.
        self.state.iteration = it
        try:
            with self.phases.time("publish"):
                self.sampler.publish_adapter(it + 1)
            if pipeline is not None:
                pipeline.published(it + 1)
        finally:  # the row is written even when the adapter could not be
            self._log(it, row, time.perf_counter() - t0, pipeline)
        return row

    def _sample(self, it: int, pipeline: RolloutPipeline | None) -> tuple[UpdateBatch, dict]:
        """Rank 0: iteration ``it``'s batch, from the rollout pipeline when there is one."""
        return pipeline.get(it) if pipeline is not None else self.sampler.collect(it)

    @contextlib.contextmanager
    def _stop_before_update(
        self, it: int, rng: dict[str, Any], failed_rollouts: bool = False
    ) -> Iterator[None]:
        """Samples abandoned for a stop (``RolloutsInterrupted``) end the run at iteration
        ``it - 1``, with the RNG states ``rng`` of its end: nothing of ``it`` was applied. With
        ``failed_rollouts`` so do failed rollouts once a signal came: after a signal, failed
        episodes are its doing (it may reach an env's own processes first), a preemption, not
        an env error."""
        try:
            yield
        except (EnvErrorBudgetExceeded, TrainingStopped):
            if not (failed_rollouts and self._stop_requested()):
                raise
            raise self._interrupted(it - 1, rng=rng) from None
        except RolloutsInterrupted:
            raise self._interrupted(it - 1, rng=rng) from None

    def _received(self, collected: tuple[UpdateBatch, dict[str, Any]]) -> tuple[UpdateBatch, dict]:
        """The batch and its rollout statistics, the engine's and the envs' seconds charged
        to the phases."""
        batch, stats = collected[0], dict(collected[1])
        self.phases.add("generation", stats.pop("generate_s"))
        self.phases.add("env", stats.pop("env_s"))
        return batch, stats

    def _row(
        self, it: int, batch: UpdateBatch, metrics: dict[str, Any], stats: dict[str, Any],
        checks: dict[str, Any], from_sampler: bool, update_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        """Iteration ``it``'s metrics row; the run's state counts its skipped steps and
        entropy, and an iteration without policy-gradient signal is said."""
        grad_norm = metrics.pop("grad_norm")
        mismatch = (
            UNMEASURED_MISMATCH
            if from_sampler
            else sampler_mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.mask)
        )
        self.state.bad_steps += metrics["skipped_steps"]
        self.state.cumulative_entropy += metrics["entropy"]
        n_groups, staleness = batch.n_groups, it - batch.versions
        if metrics["zero_adv_groups"] == n_groups:
            self.run.say(
                f"iteration {it}: all {n_groups} groups have equal rewards within the group; "
                "no policy-gradient signal this iteration",
                file=sys.stderr,
            )
        return {
            "iteration": it,
            "algo": self.algo.name,
            **metrics,
            "cumulative_entropy": self.state.cumulative_entropy,
            **stats,
            "learner_tokens": int(batch.lengths.sum()),
            "staleness_mean": float(staleness.float().mean()),
            "staleness_max": int(staleness.max()),
            "entropy_by_turn": entropy_by_turn(batch.old_logprobs, batch.mask),
            "groups": n_groups,
            "sampler_mismatch": mismatch["mean_abs_diff"],
            "sampler_mismatch_max": mismatch["max_abs_diff"],
            "sampler_ratio_outside": mismatch["frac_ratio_outside"],
            "sampler_nonfinite": mismatch["sampler_nonfinite"],
            **checks,
            "update_s": update_s,
            "grad_norm": grad_norm,
            "learner_ranks": self.ranks.world,
        }

    def _log(
        self, it: int, row: dict[str, Any], seconds: float, pipeline: RolloutPipeline | None
    ) -> None:
        """Write iteration ``it``'s row with its timings: the phases, an async run's split of
        the cores, the whole iteration's ``seconds`` and the wait for its rollouts."""
        row["phases_s"] = self.phases.take()
        row.update(self.sampler.observe_phases(row["phases_s"]))  # an async run's core split
        row["iteration_s"] = seconds
        row["rollout_wait_s"] = pipeline.wait_s if pipeline is not None else 0.0
        self.run.log(row, it)

    def _evaluate_and_save(self, it: int, row: dict[str, Any]) -> None:
        """After iteration ``it``: its summary line, the held-out evaluation when due, and a
        checkpoint every ``checkpoint_every`` iterations, after the last and at a new best; a
        stop asked for ends the run after checkpointing ``it`` (without evaluating first)."""
        cfg = self.cfg
        self.run.say(summary_line(row))
        improved = False
        stopping = self._stop_requested()  # then an evaluation would only delay the stop
        due = self.sampler.evaluation_due(it)
        if due and not stopping:
            improved = self._evaluate(it)
        if stopping or self._stop_requested():
            self.state.evaluation_owed = due and stopping  # the resume evaluates it first
            raise self._interrupted(it, best=improved)
        if (it + 1) % cfg.checkpoint_every == 0 or it == cfg.iterations - 1 or improved:
            self.checkpoint(it, best=improved)
        if self.state.bad_steps > cfg.max_bad_steps:
            raise TrainingStopped(
                f"{self.state.bad_steps} optimizer steps were skipped for non-finite losses "
                f"or gradients (max_bad_steps={cfg.max_bad_steps}); lower lr or use dtype fp32"
            )

    def _evaluate(self, it: int) -> bool:
        """The held-out evaluation of the weights after iteration ``it``, logged; whether it
        is the best so far."""
        eval_row = self.sampler.evaluate(it)
        self.run.log(eval_row, it)
        # an eval with env errors measured the env too: it never marks the best
        score = eval_row["pass@1"] if eval_row["env_errors"] == 0 else None
        improved = score is not None and score > self.state.best
        if improved:
            self.state.best = score
        return improved

    def _evaluate_owed(self, it: int) -> None:
        """A resume after a stop that skipped iteration ``it``'s due evaluation: run it now,
        in the place an uninterrupted run has it (after ``it``'s row, before ``it + 1``'s), and
        checkpoint ``it`` again where it is the best so far, as that run would have."""
        improved = self._evaluate(it)
        self.state.evaluation_owed = False
        if improved:
            self.checkpoint(it, best=True)

    def _old_logprobs(self, batch: UpdateBatch, it: int, staleness: torch.Tensor) -> bool:
        """Give ``batch`` the ratio's denominator where the update would not score it itself:
        the engine's own log-probs (``old_logprobs sampler``, where they are finite), or, for a
        stale batch, the learner's under the versions that sampled it. True: the engine's."""
        if self.cfg.old_logprobs == "sampler" and sampler_scores_usable(
            batch.sampler_logprobs, batch.mask
        ):
            batch.old_logprobs = batch.sampler_logprobs.clone()
            return True
        if bool((staleness > 0).any()):
            versions = self.sampler.adapters.versions
            batch.old_logprobs = self.learner.sampling_version_logprobs(batch, it, versions)
        return False

    def _stop_requested(self) -> bool:
        """Whether a signal asked the run to stop (rank 0 decides for a torchrun group)."""
        return bool(distributed.on_main(self.shutdown.requested, self.ranks))

    def _interrupted(self, it: int, best: bool = False, rng: dict[str, Any] | None = None):
        """Checkpoint iteration ``it`` unless it is on disk already, and the exception that
        ends the run."""
        if it >= 0 and self.run.saved != it:
            self.checkpoint(it, best=best, rng=rng)
        return self.shutdown.interrupted(None if it < 0 else f"iter-{it:06d}")

    # ----- saving ---------------------------------------------------------------------------

    def checkpoint(self, it: int, best: bool = False, rng: dict[str, Any] | None = None) -> None:
        """Write checkpoint ``it`` (rank 0). ``rng``: the RNG states to store (default: now)."""
        # collectives under torchrun: every rank takes part, rank 0 writes
        sampler_weights = self.sampler.adapters.to_save(it)
        gathered = self.learner.gathered()
        if not self.ranks.main:
            return
        self.state.control = self.control.state_dict()
        self.run.save(it, self.state, self.learner, best=best, rng=rng,
                      sampler_weights=sampler_weights, gathered=gathered)  # fmt: skip

    def close(self, barrier: bool = True) -> None:
        """Close the engine this trainer started and the metrics, and release the run folder.
        ``barrier=False`` after a failed setup, where other ranks may not get this far."""
        self.sampler.close()
        self.run.close()
        if barrier:
            distributed.barrier(self.ranks)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# What ends a run early with a one-line message (exit code 1 from the command).
STOPS = (TrainingStopped, EnvErrorBudgetExceeded, RunFileError, NonFiniteSteps, NonFiniteWeights)


def train(cfg: TrainConfig, shutdown: ShutdownRequest | None = None) -> Path:
    """Run ``cfg`` to the end; returns the run folder. A ``--resume`` whose checkpoints already
    cover ``iterations`` says "nothing to do" and changes nothing. A run that stops early
    (:data:`STOPS`, or :class:`~entrogym.train.shutdown.Interrupted` on a signal) records why
    in ``config_history.jsonl`` and raises. ``shutdown``: signal handlers the caller armed
    already (the command does, before its imports); by default they are armed here."""
    shutdown = shutdown or ShutdownRequest(cfg.shutdown_grace)
    with shutdown:  # SIGTERM / SIGINT from here on: checkpoint, then Interrupted
        if shutdown.requested():
            raise shutdown.interrupted(None)
        try:
            trainer = Trainer(cfg, shutdown=shutdown)
        except NothingToDo as done:
            if not distributed.launched_by_torchrun() or int(os.environ.get("RANK", "0")) == 0:
                print(done, flush=True)
            return Path(cfg.out)
        except StopNow:  # a second signal during start-up; the folder was released
            raise shutdown.stopped_now(None) from None
        try:
            trainer.fit()
        except StopNow:
            saved = trainer.run.saved
            stop = shutdown.stopped_now(None if saved is None else f"iter-{saved:06d}")
            trainer.run.record_stop(stop)
            raise stop from None
        except (*STOPS, Interrupted) as exc:
            trainer.run.record_stop(exc)  # in config_history.jsonl
            raise
        finally:
            trainer.close()
            if trainer.ranks.distributed:
                torch.distributed.destroy_process_group()
    return trainer.run.dir
