"""The sampler: the rollout engine and what it samples with.

It starts the engine (an in-process ``hf`` engine shares the learner's frozen base weights),
publishes each weight version as an adapter folder the engine loads (``adapters/vNNNNNN``),
keeps the versions a stale batch may come from (``--max-staleness``; both in
``entrogym.train.sampler.adapters``), collects each iteration's rollouts (in a rollout thread
beside the update when K >= 1: ``entrogym.train.sampler.pipeline``) and any other batch the run
asks for (``rollouts``: the entropy control's samples, ``entrogym.train.control_feed``), and
runs the held-out evaluation on the same engine. Under ``torchrun`` rank 0 alone runs the
engine; publishing and the kept versions involve every rank.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from entrogym.agents.agent import LLMAgent
from entrogym.agents.config import turn_budget_rule
from entrogym.agents.engines import Engine, SamplingParams, make_engine, resolve_engine_kind
from entrogym.agents.engines.shared_weights import frozen_base_tensors
from entrogym.agents.env_workers import check_portable, shared_env_workers
from entrogym.agents.rollout import check_env_errors, collect_rollouts
from entrogym.algos import UpdateBatch
from entrogym.envs.base import env_attr, make_text_env, task_ids_of
from entrogym.train.batch import collate_episodes, success_rate, usable_episodes
from entrogym.train.config import TrainConfig
from entrogym.train.devices import distributed
from entrogym.train.evaluation.evaluate import EvalPlan, plan_evaluation, run_evaluation
from entrogym.train.folder.layout import TOOL_ERRORS_FILE
from entrogym.train.folder.rng import iteration_seed
from entrogym.train.folder.safety import adapter_folder
from entrogym.train.folder.turn_metrics import episode_turn_metrics
from entrogym.train.phases import PhaseClock
from entrogym.train.progress import counter
from entrogym.train.sampler.adapters import AdapterVersions
from entrogym.train.sampler.pipeline import RolloutPipeline
from entrogym.train.sampler.threads import ThreadSplit
from entrogym.train.shutdown import ShutdownRequest


class TrainingStopped(RuntimeError):
    """Raised when the run cannot go on (too many non-finite steps, no usable episode)."""


class Sampler:
    """Rollouts, evaluation and the adapters they read. Built before the run folder opens (it
    checks the split and the eval env); :meth:`start` it once the learner's policy exists."""

    def __init__(
        self,
        cfg: TrainConfig,
        ranks: distributed.Ranks,
        shutdown: ShutdownRequest,
        engine: Engine | None = None,
    ) -> None:
        """``engine``: a running rollout engine to share (its owner closes it); by default the
        sampler starts the one ``cfg`` names and closes it in :meth:`close`."""
        self.cfg, self.ranks, self.shutdown = cfg, ranks, shutdown
        self.run_dir = Path(cfg.out)
        self.engine, self._owns_engine = engine, engine is None
        # the published versions and, with max_staleness, the kept ones (sampler/adapters.py)
        self.adapters = AdapterVersions(cfg.max_staleness, self.run_dir, ranks, cfg.model)
        # envs run in worker processes shared by this process's runs (0: in this process)
        self.env_workers = shared_env_workers(cfg.env_limits()) if cfg.env_workers else 0
        self._engine_lock = threading.Lock()  # rollouts (maybe a thread) and eval take turns
        self._pipeline: RolloutPipeline | None = None  # the training loop's, once it runs
        # the env kwargs of the rollouts: --max-turns reaches an env that takes it
        self.env_kwargs = cfg.env_kwargs_for(cfg.env, cfg.env_kwargs)
        # a split smaller than tasks_per_iter is a config error
        # and the turn-budget rule: the given one, else the env's declared one (as eval reads it)
        self.tasks, self.env_max_turns, self.on_turn_budget = _task_ids(cfg)
        self.cut_announced = False  # a cut turn that ended a multi-turn episode was said
        self.eval_plan = _plan_evaluation(cfg)  # so is a bad eval split or eval env
        self.threads: ThreadSplit | None = None  # the cores' split in an async hf run
        # Sample every turn to max_response_tokens, past EOS and the end-of-turn token (vLLM's
        # ignore_eos): a benchmark sets it on a built trainer to time engines at equal work;
        # no training option, since a run sampled so learns nothing.
        self.ignore_eos = False

    def start(self, policy: torch.nn.Module) -> None:
        """The agent (tokenizer, chat template, turn budget), the kept weight versions and,
        on rank 0, the engine (engines may seed torch: before a resume restores the RNGs)."""
        cfg = self.cfg
        self.policy = policy
        self.agent = LLMAgent.from_model(
            cfg.model, **{**cfg.agent_kwargs(), "on_turn_budget": self.on_turn_budget}
        )
        self.pad_id = self.agent.tokenizer.pad_token_id or 0
        self.adapters.start(policy)
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
                    max_loras=self.adapters.budget.versions,
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

    # ----- weight versions ------------------------------------------------------------------

    def publish_adapter(self, version: int) -> None:
        """Write the current weights as ``adapters/vNNNNNN`` for the rollouts, evaluation and
        servers that follow (:meth:`AdapterVersions.publish`)."""
        self.adapters.publish(version)

    def release_engine_caches(self) -> None:
        """Let the engine free what it keeps only to sample faster (``Engine.release_caches``:
        the ``hf`` engine's merged weights), while the learner needs the memory."""
        if self.engine is not None:
            self.engine.release_caches()

    # ----- rollouts -------------------------------------------------------------------------

    def pipeline(self, start: int, stop: int, phases: PhaseClock | None = None) -> RolloutPipeline:
        """Iterations ``start .. stop - 1``'s batches, collected ahead of the update by up to
        ``max_staleness`` versions (rank 0 alone collects). ``phases``: the learner's phase
        clock, which an elastic split of the cores watches."""
        self._pipeline = RolloutPipeline(
            self.collect,
            max_staleness=self.cfg.max_staleness,
            start=start,
            stop=stop if self.ranks.main else start,
            floor=self.adapters.oldest(start),
            before_batch=self._split_threads(),
        )
        if self.threads is not None and self.threads.split == "elastic" and phases is not None:
            self.threads.watch(lambda: self._pipeline is not None and self._pipeline.collecting)
            phases.watch(self.threads.phase_started, self.threads.phase_ended)
        return self._pipeline

    def _should_stop(self) -> bool:
        """Whether rollouts in progress are abandoned: a signal asked the run to stop, or the
        pipeline they run in was closed (the loop ended on an error)."""
        return self.shutdown.requested() or (self._pipeline is not None and self._pipeline.stopping)

    def _split_threads(self) -> Any:
        """With rollouts beside the update and the engine in this process (``hf``), the two
        share the cores (:mod:`entrogym.train.sampler.threads`): half and half (or
        ``threads`` for the learner), re-chosen by measured cost with ``thread_split cost``,
        all of them to the learner while the rollout thread idles with ``elastic``.
        Returns the rollout thread's call before each batch."""
        if not self.cfg.max_staleness or getattr(self.engine, "kind", None) != "hf":
            self.threads = None
            return None
        split = self.cfg.thread_split
        self.threads = ThreadSplit(os.cpu_count() or 1, self.cfg.threads, split=split)
        self.threads.start()
        return self.threads.apply_rollout

    def observe_phases(self, phases_s: dict[str, float]) -> dict[str, Any]:
        """After an iteration: the metrics row's record of the split it ran with (empty where
        no split is re-chosen: ``thread_split even``, ``threads`` set, or no split at all;
        ``elastic`` records the learner's seconds on every core); then the cores are re-split
        by its costs."""
        if self.threads is None or (self.threads.fixed and not self.threads.elastic):
            return {}
        used = self.threads.row()
        self.threads.observe(phases_s)
        return used

    def collect(
        self, it: int, version: int | None = None, adapter: Path | None = None
    ) -> tuple[UpdateBatch, dict[str, Any]]:
        """Rank 0: iteration ``it``'s rollouts, sampled by weight ``version`` (default ``it``,
        the current weights; from the folder ``adapter`` if given, else its own), as a batch
        plus the rollout statistics of the metrics row. Safe to run in the rollout thread.
        Raises ``TrainingStopped`` when no usable episode came back."""
        cfg = self.cfg
        seed = iteration_seed(cfg.seed, it)
        # In an async run each batch samples from its own stream, whenever the thread gets to it.
        stream = self.engine.seeded(seed) if cfg.max_staleness else None
        return self.rollouts(
            it,
            self.tasks_of(it),
            version=it if version is None else version,
            adapter=adapter,
            temperature=cfg.temperature,
            stream=stream,
        )

    def tasks_of(self, it: int) -> list[str]:
        """Iteration ``it``'s tasks: ``tasks_per_iter`` distinct ones of the split."""
        return random.Random(iteration_seed(self.cfg.seed, it)).sample(
            self.tasks, self.cfg.tasks_per_iter
        )

    def rollouts(
        self,
        it: int,
        tasks: list[str],
        *,
        version: int,
        adapter: Path | None,
        temperature: float,
        stream: contextlib.AbstractContextManager[None] | None,
        what: str | None = None,
        label: str = "rollouts",
    ) -> tuple[UpdateBatch, dict[str, Any]]:
        """``samples`` rollouts of each of ``tasks`` by weight ``version`` at ``temperature``,
        inside ``stream`` (a seeded scope, or None: the engine's own stream), with the env
        seeds iteration ``it`` draws; as a batch and its rollout statistics. ``what``: the
        batch as an error names it (default: iteration ``it``); ``label``: what the progress
        counter calls them."""
        cfg = self.cfg
        t0 = time.perf_counter()
        total = len(tasks) * cfg.samples
        with (
            self._engine_lock,
            stream or contextlib.nullcontext(),
            counter(total, label, "episodes") as on_progress,
        ):
            rollouts = collect_rollouts(
                cfg.env,
                tasks,
                self.engine,
                self.agent,
                k=cfg.samples,
                sampling=SamplingParams(temperature=temperature, ignore_eos=self.ignore_eos),
                adapter=str(adapter or adapter_folder(self.run_dir, version)),
                min_done_per_task=cfg.early_stop_min_per_task,
                min_done_fraction=cfg.early_stop_fraction,
                env_kwargs=self.env_kwargs,
                # one env seed per episode: the iteration's episodes, counted from the run's start
                seed=iteration_seed(cfg.seed, it * cfg.tasks_per_iter * cfg.samples),
                env_workers=self.env_workers,
                env_timeout=cfg.env_timeout,
                # under torchrun, rank 0 alone collects: a stop is only taken between iterations
                should_stop=None if self.ranks.distributed else self._should_stop,
                on_progress=on_progress,
                turn_rewards=cfg.turn_rewards,
                tool_error_log=self.run_dir / TOOL_ERRORS_FILE,
            )
        # An env that raises or breaks its contract fails its episode (logged once per message);
        # past the allowed share the run stops, naming the first failure.
        check_env_errors(list(rollouts), cfg.max_env_error_fraction)
        for episode in rollouts:
            episode.info["policy_version"] = version
        episodes = usable_episodes([e for e in rollouts if not e.failed])
        if not episodes:
            what = what or f"iteration {it}"
            raise TrainingStopped(f"{what}: no episode with action tokens came back")
        stats = {
            "success_rate": success_rate(episodes),
            "response_tokens_mean": sum(e.num_action_tokens for e in episodes) / len(episodes),
            "episodes": len(episodes),
            "env_errors": rollouts.stats["env_errors"],
            "rollout_s": time.perf_counter() - t0,
            "tokens_per_s": rollouts.stats["tokens_per_s"],
            "generated_tokens": rollouts.stats["generated_tokens"],
            "policy_version": version,
            "generate_s": rollouts.stats["generate_s"],  # charged to the phases by the trainer
            "env_s": rollouts.stats["env_s"],
            **episode_turn_metrics(rollouts, cancelled=rollouts.stats["cancelled"]),
        }
        self._announce_cut_turns(stats, what or f"iteration {it}")
        return collate_episodes(episodes, self.pad_id, cfg.turn_rewards), stats

    def _announce_cut_turns(self, stats: dict[str, Any], what: str) -> None:
        """Once per run: say that the default turn-budget rule ended multi-turn episodes at a
        turn the token budget cut (the metrics rows count them every iteration)."""
        cfg = self.cfg
        cut = stats["end_reasons"]["turn_budget"]  # episodes a cut turn ended
        if self.cut_announced or not cut or self.env_max_turns == 1:
            return
        self.cut_announced = True
        allows = f"allows max_turns {self.env_max_turns}" if self.env_max_turns else "may go on"
        print(
            f"entrogym train: {cut} of {stats['episodes']} episodes of {what} "
            f"ended at a turn cut by --max-response-tokens {cfg.max_response_tokens}, though "
            f"{cfg.env} {allows}: --on-turn-budget {self.on_turn_budget} ends an episode there; "
            "pass --on-turn-budget step to send a cut turn to the env and go on (said once; the "
            "metrics rows count turns_cut and end_reasons.turn_budget)",
            file=sys.stderr,
            flush=True,
        )

    # ----- evaluation -----------------------------------------------------------------------

    def evaluation_due(self, it: int) -> bool:
        """Whether the weights after iteration ``it`` are evaluated: every ``eval_every``
        iterations and after the last one."""
        every, last = self.cfg.eval_every, self.cfg.iterations - 1
        return self.eval_plan is not None and (it % every == 0 or it == last)

    def evaluate(self, it: int) -> dict[str, Any]:
        """Held-out evaluation of the weights after iteration ``it``'s update -- the weights a
        checkpoint of ``it`` holds (and the next iteration's rollouts use). Rank 0 evaluates;
        every rank gets the eval row."""
        cfg = self.cfg

        def run() -> dict[str, Any]:
            with self._engine_lock:  # the rollout thread and evaluation take turns
                plan = self.eval_plan or _plan_evaluation(cfg)
                result = run_evaluation(self.engine, self.agent, plan, samples=cfg.eval_samples,
                                        adapter=str(self.adapters.adapter), temperature=cfg.temperature,
                                        seed=cfg.seed, env_workers=self.env_workers,
                                        env_timeout=cfg.env_timeout,
                                        turn_rewards=cfg.turn_rewards,
                                        tool_error_log=self.run_dir / TOOL_ERRORS_FILE)  # fmt: skip
            return {"kind": "eval", "iteration": it, "env": cfg.eval_env, **result.summary}

        return distributed.on_main(run, self.ranks)

    def close(self) -> None:
        """Close the engine this sampler started."""
        if self.engine is not None and self._owns_engine:
            self.engine.close()
            self.engine = None


def _task_ids(cfg: TrainConfig) -> tuple[list[str], int | None, str]:
    """The training split's task ids, the env's ``max_turns`` (None: it has none) and the
    turn-budget rule (``cfg``'s, else the env's declared one, else ``truncate``)."""
    if cfg.env_workers:
        check_portable(cfg.env)  # before any model loads
    env = make_text_env(cfg.env, **cfg.env_kwargs_for(cfg.env, cfg.env_kwargs))
    tasks = task_ids_of(env, cfg.split)
    max_turns = env_attr(env, "max_turns")
    rule = turn_budget_rule(cfg.env, env, cfg.on_turn_budget)
    env.close()
    if not tasks:
        raise ValueError(f"env {cfg.env!r} has no tasks in split {cfg.split!r}")
    if cfg.tasks_per_iter > len(tasks):
        raise ValueError(
            f"tasks_per_iter ({cfg.tasks_per_iter}) is above the {len(tasks)} tasks of "
            f"{cfg.env} (split {cfg.split or 'default'}); an iteration draws distinct tasks, "
            f"so pass --tasks-per-iter {len(tasks)} or less (or more --samples per task)"
        )
    if cfg.measures_input_dependence and cfg.input_dependence_tasks > len(tasks):
        raise ValueError(
            f"input_dependence_tasks ({cfg.input_dependence_tasks}) is above the {len(tasks)} "
            f"tasks of {cfg.env} (split {cfg.split or 'default'}); pass "
            f"--input-dependence-tasks {len(tasks)} or less"
        )
    return tasks, max_turns if isinstance(max_turns, int) else None, rule


def _plan_evaluation(cfg: TrainConfig) -> EvalPlan | None:
    if not (cfg.eval_env and cfg.eval_every):
        return None
    # the run's --on-turn-budget when given, else the eval env's own rule (as for training)
    kwargs = cfg.env_kwargs_for(cfg.eval_env, cfg.eval_env_kwargs)
    return plan_evaluation(cfg.eval_env, kwargs, split=cfg.eval_split,
                           max_tasks=cfg.eval_tasks, samples=cfg.eval_samples,
                           on_turn_budget=cfg.on_turn_budget)  # fmt: skip
