"""The RL training recipe: collect -> update (rescoring in fp32) -> hand the adapter over.

Read :class:`Trainer` top to bottom: setup, then ``iteration`` (the paper's loop, appendix
"Training"), then the checkpoint. It holds no math of its own (every formula is a named function
in ``entrogym.algos``) and little state: it drives three parts, each owning one concern:

- ``run`` (:class:`~entrogym.train.run.Run`): the run folder, its lock, resume, checkpoints,
  metrics, trackers and the config history;
- ``sampler`` (:class:`~entrogym.train.sampler.engine.Sampler`): the rollout engine, the adapters it
  samples with, the kept weight versions, rollouts (ahead of the update with ``max_staleness``
  K >= 1: ``entrogym.train.sampler.pipeline``), the target probe's batches and evaluation (the
  control's own samples, scored by the learner: ``entrogym.train.extra_samples``);
- ``learner`` (:class:`~entrogym.train.learner.update.Learner`): the policy, optimizer and loss scaler,
  fp32 scoring and the update's steps.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.agents.engines import Engine
from entrogym.agents.rollout import EnvErrorBudgetExceeded, RolloutsInterrupted
from entrogym.algos import EntropyControl, UpdateBatch
from entrogym.algos.step_guard import NonFiniteSteps
from entrogym.train.config import TrainConfig
from entrogym.train.devices import distributed
from entrogym.train.extra_samples import (
    attach_temperature_samples,
    observe_probe_states,
    probe_target,
    states_to_dict,
)
from entrogym.train.folder.adapter_files import NonFiniteWeights
from entrogym.train.folder.checkpoint import read_training_state, rng_state, set_rng_state
from entrogym.train.folder.metrics import summary_line
from entrogym.train.folder.safety import NothingToDo, RunFileError
from entrogym.train.folder.state import TrainState
from entrogym.train.folder.turn_metrics import entropy_by_turn
from entrogym.train.heap import HeapTrim
from entrogym.train.input_probe import measure_input_dependence
from entrogym.train.learner.mismatch import (
    UNMEASURED_MISMATCH,
    sampler_mismatch,
    sampler_scores_usable,
)
from entrogym.train.learner.update import Learner
from entrogym.train.phases import PhaseClock, PhaseHook
from entrogym.train.progress import progress
from entrogym.train.run import Run
from entrogym.train.sampler.engine import PROBE_ITERATION, Sampler, TrainingStopped
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
            self.sampler.load_versions(saved.get("sampler_weights"))
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
        self.sampler.publish_older_versions(start)
        probed, batches = probe_target(
            self.cfg.algo, self.control, self.sampler, self.learner, self.ranks, start
        )
        if probed:
            self.run.say(probed)
        if self.control.tracks_probe_states and batches:  # a resumed run keeps its states
            self.state.probe_states = states_to_dict(batches)
        with self.sampler.pipeline(start, self.cfg.iterations, self.phases) as pipeline:
            iterations = range(start, self.cfg.iterations)
            for it in progress(iterations, desc="iterations", unit="iter", enabled=self.ranks.main):
                self._fit_iteration(it, pipeline)

    def _fit_iteration(self, it: int, pipeline: RolloutPipeline) -> None:
        cfg = self.cfg
        t0 = time.perf_counter()
        rng_at_start = rng_state()  # what a checkpoint of it - 1 holds
        try:
            collected = distributed.on_main(lambda: pipeline.get(it), self.ranks)
        except (EnvErrorBudgetExceeded, TrainingStopped):
            # After a signal, failed episodes are its doing (it may reach an env's own
            # processes first): a preemption, not an env error. Nothing of it was applied.
            if not self._stop_requested():
                raise
            raise self._interrupted(it - 1, rng=rng_at_start) from None
        except RolloutsInterrupted:
            raise self._interrupted(it - 1, rng=rng_at_start) from None
        try:
            row = self.iteration(it, collected)
        except RolloutsInterrupted:  # the aepo lever's samples: nothing applied either
            raise self._interrupted(it - 1, rng=rng_at_start) from None
        self.state.iteration = it
        try:
            with self.phases.time("publish"):
                self.sampler.publish_adapter(it + 1)  # the weights rollouts, eval, checkpoint use
            pipeline.published(it + 1)
        finally:  # the row is written even when the adapter could not be
            row["phases_s"] = self.phases.take()
            row.update(self.sampler.observe_phases(row["phases_s"]))  # an async run's core split
            row["iteration_s"] = time.perf_counter() - t0
            row["rollout_wait_s"] = pipeline.wait_s
            self.run.log(row, it)
        self.run.say(summary_line(row))
        improved = False
        stopping = self._stop_requested()  # then an evaluation would only delay the stop
        if self.sampler.evaluation_due(it) and not stopping:
            eval_row = self.sampler.evaluate(it)
            self.run.log(eval_row, it)
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

    def iteration(
        self, it: int, collected: tuple[UpdateBatch, dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """One iteration on the weights of version ``it``; returns its metrics row."""
        # 1. Rollouts (rank 0), broadcast to every rank of a torchrun learner; ``fit`` hands
        #    them over from its rollout pipeline.
        if collected is None:
            collected = distributed.on_main(lambda: self.sampler.collect(it), self.ranks)
        batch, rollout_stats = collected[0], dict(collected[1])
        self.phases.add("generation", rollout_stats.pop("generate_s"))
        self.phases.add("env", rollout_stats.pop("env_s"))
        staleness = it - batch.versions
        temperature_stats = attach_temperature_samples(  # the aepo lever's only
            it, self.control, self.sampler, self.learner, self.ranks, self.phases
        )
        input_stats = measure_input_dependence(  # when due, on the current weights
            it, self.cfg, self.control, self.sampler, self.learner, self.ranks, self.phases
        )

        if not self.cfg.max_staleness:  # no rollouts beside the update, and the next ones
            self.sampler.release_engine_caches()  # sample a new version: its memory is free

        # 2. The preset's update: advantages, entropy control, clipped loss, steps. The old
        #    log-probs are rescored here in fp32 (the engine's only with ``old_logprobs
        #    sampler``): by the update itself, which reuses the on-policy first minibatch's
        #    scoring pass, or, for a stale batch, under the weights of the version that sampled it.
        entropy_check = self.learner.entropy_check(batch)
        t0 = time.perf_counter()
        observe_probe_states(self.control, self.learner, self.state.probe_states)
        if self.control.tracks_relative:  # measured on this batch, before its update
            self.control.observe_states(*self.learner.relative_entropy(batch))
        batch.compute_advantages(self.algo.advantage)
        from_sampler = self._old_logprobs(batch, it, staleness)
        metrics = self.learner.update(self.control, batch, it)
        grad_norm = metrics.pop("grad_norm")
        update_s = time.perf_counter() - t0
        mismatch = (
            UNMEASURED_MISMATCH
            if from_sampler
            else sampler_mismatch(batch.old_logprobs, batch.sampler_logprobs, batch.mask)
        )
        self.state.bad_steps += metrics["skipped_steps"]
        self.state.cumulative_entropy += metrics["entropy"]
        n_groups = batch.n_groups
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
            **rollout_stats,
            **temperature_stats,
            **input_stats,
            "learner_tokens": int(batch.lengths.sum()),
            "staleness_mean": float(staleness.float().mean()),
            "staleness_max": int(staleness.max()),
            "entropy_by_turn": entropy_by_turn(batch.old_logprobs, batch.mask),
            "groups": n_groups,
            "sampler_mismatch": mismatch["mean_abs_diff"],
            "sampler_mismatch_max": mismatch["max_abs_diff"],
            "sampler_ratio_outside": mismatch["frac_ratio_outside"],
            "sampler_nonfinite": mismatch["sampler_nonfinite"],
            **entropy_check,
            "update_s": update_s,
            "grad_norm": grad_norm,
            "learner_ranks": self.ranks.world,
        }

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
            versions = self.sampler.versions
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
        sampler_weights = self.sampler.versions_to_save(it)
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
