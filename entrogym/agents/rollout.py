"""Rollout collection: K samples per task, all episodes stepped in lockstep.

Every step batches one generation call across all running episodes, then steps the envs whose
turn ended. Early stopping (paper appendix "Training") is checked after every step: once at
least ``min_done_per_task`` of the K rollouts of every task and ``min_done_fraction`` of all
rollouts are done, the rest are cancelled. With ``chunk_tokens`` a turn is generated in chunks
of that many tokens (a chunk continues from the ids sampled so far, so nothing changes but the
places where the loop can stop), which lets early stopping act inside long single-turn answers.

Envs given by id run in env worker processes (:mod:`entrogym.agents.env_workers`): each
call has a time limit and each worker a memory limit, so an env that hangs, leaks or crashes
fails its own episodes and the worker is replaced; ``env_workers=0`` runs them here.

Episode errors are data: an env that raises (reset, step, end_episode), times out, dies, or
breaks the text-env contract (:mod:`entrogym.envs.contract`: an observation that is not UTF-8
text; an ``info["success"]`` that is not a bool; a reward that is not a real number, is paid
before the last step, is not finite or lies outside the env's ``reward_range``) fails that
episode only. It comes back with reward 0 and ``Episode.error`` (env id, task id, message), is
counted in ``stats["env_errors"]``, its message goes to stderr once, the trainer leaves it out,
and :func:`check_env_errors` stops a run whose failed share is too high. Env attributes are
reached with ``env.get_wrapper_attr``, so envs wrapped in Gymnasium wrappers work.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from entrogym.agents.agent import LLMAgent, Transcript, TurnEnd
from entrogym.agents.engines.base import Engine, SamplingParams
from entrogym.agents.env_workers import (
    EnvLimits,
    EnvWorkers,
    check_portable,
    error_name,
    shared_env_workers,
)
from entrogym.agents.episode import (
    EnvErrorBudgetExceeded,
    Episode,
    check_env_errors,
    log_env_error_once,
)
from entrogym.envs.base import env_attr, make_text_env
from entrogym.envs.contract import check_reply, check_step_reward, check_terminal_reward

__all__ = [
    "EnvErrorBudgetExceeded",
    "Episode",
    "Rollouts",
    "RolloutsInterrupted",
    "check_env_errors",
    "collect_rollouts",
    "early_stop_reached",
]

EnvSource = str | Callable[[], Any]


def early_stop_reached(
    done_per_task: Sequence[int], k: int, min_done_per_task: int = 4, min_done_fraction: float = 0.9
) -> bool:
    """Paper appendix "Training": stop once at least 4 of the 6 rollouts of every task and 90%
    of all rollouts are in. ``min_done_per_task`` is capped at ``k``."""
    need = min(min_done_per_task, k)
    total = k * len(done_per_task)
    return all(d >= need for d in done_per_task) and sum(done_per_task) >= math.ceil(
        min_done_fraction * total - 1e-9
    )


class Rollouts(list):
    """``list[Episode]`` with ``stats``: counts (episodes, cancelled, env_errors, truncated),
    the distinct env error messages, generated tokens, time spent generating / stepping envs /
    in total, tokens per second, and the mean reward of the episodes that did not fail."""

    stats: dict[str, Any]


@dataclass
class _Run:
    index: int
    task_id: str
    group_id: int
    env: Any = None
    transcript: Transcript | None = None
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    cancelled: bool = False
    truncated: bool = False
    error: str | None = None
    error_key: str = ""
    generate_s: float = 0.0
    env_s: float = 0.0
    start: float = field(default_factory=time.perf_counter)
    end: float = 0.0

    def finish(self, reward: float = 0.0, truncated: bool = False, **info: Any) -> None:
        self.done, self.reward, self.truncated = True, float(reward), truncated
        self.info.update(info)
        self.end = time.perf_counter()

    def fail(self, env_id: str, where: str, error: BaseException) -> None:
        """End the episode as failed; the message names the env, the task and the error."""
        text = f"{error_name(error)}: {error}"
        self.error = f"env {env_id!r}, task {self.task_id!r}, {where}: {text}"
        self.error_key = f"{env_id}\0{where}\0{text}"
        self.finish(0.0, error=self.error, success=False)


def _env_id(source: EnvSource, env: Any) -> str:
    """The registered id, or the factory's (or the env class's) name."""
    if isinstance(source, str):
        return source
    spec = getattr(env, "spec", None)
    if spec is not None and getattr(spec, "id", None):
        return str(spec.id)
    name = getattr(source, "__name__", "")
    if name and name != "<lambda>":
        return name
    return type(getattr(env, "unwrapped", env)).__name__ if env is not None else name


class RolloutsInterrupted(Exception):
    """``should_stop`` asked the collection to stop (the trainer received SIGTERM or SIGINT);
    the episodes in progress were abandoned."""


class _Collection:
    """The envs, engine and agent of one :func:`collect_rollouts` call, and its counters.

    Env calls (make, reset, step, end_episode) of different episodes run side by side on
    ``pool`` threads when the envs live in several worker processes; the agent's tokenizer is
    only used from the calling thread."""

    def __init__(
        self,
        source: EnvSource,
        env_kwargs: dict[str, Any],
        engine: Engine,
        agent: LLMAgent,
        sampling: SamplingParams,
        adapter: str | None,
        chunk_tokens: int | None,
        workers: EnvWorkers | None,
        env_timeout: float | None,
    ) -> None:
        self.source, self.env_kwargs = source, env_kwargs
        self.engine, self.agent, self.adapter = engine, agent, adapter
        self.sampling, self.chunk_tokens = sampling, chunk_tokens
        self.workers, self.env_timeout = workers, env_timeout
        threads = workers.limits.workers if workers is not None else 1
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self.stats: dict[str, Any] = {"steps": 0, "generate_calls": 0, "generated_tokens": 0}
        self.generate_s = self.env_s = 0.0
        self.env_id = source if isinstance(source, str) else ""

    def _each(self, fn: Callable[..., Any], items: Sequence[Any]) -> list[Any]:
        """``fn(*item)`` for every item, on the pool's threads when there is one."""
        if self.pool is None or len(items) < 2:
            return [fn(*item) for item in items]
        return list(self.pool.map(lambda item: fn(*item), items))

    def make_env(self, r: _Run) -> Any:
        if self.workers is not None:
            assert isinstance(self.source, str)
            return self.workers.make(self.source, self.env_kwargs, r.group_id, self.env_timeout)
        if isinstance(self.source, str):
            return make_text_env(self.source, **self.env_kwargs)
        return self.source()

    def start(self, runs: list[_Run], seed: int) -> None:
        """Make every run's env and reset it to its task, then start the agents' transcripts."""
        t0 = time.perf_counter()
        if self.workers is not None:
            self.workers.warm({r.group_id for r in runs})
        observations = self._each(self._reset, [(r, seed) for r in runs])
        for r, observation in zip(runs, observations, strict=True):
            if observation is not None:
                # a prompt over max_context is a setup error, not the env's: it raises
                r.transcript = self.agent.start(observation, r.task_id)
        self.env_s += time.perf_counter() - t0

    def _reset(self, r: _Run, seed: int) -> str | None:
        """The run's first observation, or None when making or resetting its env failed."""
        t0 = time.perf_counter()
        try:
            r.env = self.make_env(r)
            self.env_id = self.env_id or _env_id(self.source, r.env)
            observation, info = r.env.reset(seed=seed + r.index, options={"task_id": r.task_id})
            check_reply(observation, info)
        except Exception as e:  # noqa: BLE001  (one broken env must not end the batch)
            r.fail(self.env_id or _env_id(self.source, r.env), "reset", e)
            return None
        finally:
            r.env_s += time.perf_counter() - t0
        r.info.update(info)
        return observation

    def step(self, active: list[_Run]) -> None:
        """One batched generation call for the running episodes, then the envs of the turns
        that ended."""
        params = []
        for r in active:
            budget = self.agent.turn_budget(r.transcript)
            params.append(
                replace(self.sampling, max_tokens=min(budget, self.chunk_tokens or budget))
            )
        t0 = time.perf_counter()
        prompts = [r.transcript.token_ids for r in active]
        completions = self.engine.generate(prompts, params, self.adapter)
        dt = time.perf_counter() - t0
        self.generate_s += dt
        self.stats["generate_calls"] += 1
        ended: list[tuple[_Run, TurnEnd]] = []
        for r, c in zip(active, completions, strict=True):
            r.generate_s += dt
            self.stats["generated_tokens"] += len(c.token_ids)
            end = self.agent.add_completion(r.transcript, c)
            if end is not None:
                ended.append((r, end))
        t0 = time.perf_counter()
        feedback = self._each(self._env_turn, ended)
        for (r, _), observation in zip(ended, feedback, strict=True):
            if observation is not None and not self.agent.add_feedback(r.transcript, observation):
                self._context_full(r)
        self.env_s += time.perf_counter() - t0
        self.stats["steps"] += 1

    def _env_turn(self, r: _Run, end: TurnEnd) -> str | None:
        """Hand a finished turn's action to the env. Returns the env's answer when the episode
        goes on (the caller appends it), None when it ended."""
        if end.limit == "context":
            self._context_full(r)
            return None
        if end.limit == "turn" and self.agent.on_turn_budget == "truncate":
            r.finish(0.0, truncated=True, truncated_by=end.limit, success=False)
            return None
        if not end.text:
            r.finish(0.0, empty_action=True, success=False)  # envs take at least one character
            return None
        t0 = time.perf_counter()
        try:
            if end.limit == "turn":
                flag = env_attr(r.env, "flag_action_truncated")
                if flag is not None:
                    flag()
            observation, reward, terminated, truncated, info = r.env.step(end.text)
            check_reply(observation, info)
            check_step_reward(reward, terminated or truncated, env_attr(r.env, "reward_range"))
        except Exception as e:  # noqa: BLE001
            r.fail(self.env_id, "step", e)
            return None
        finally:
            r.env_s += time.perf_counter() - t0
        r.info.update(info)
        if terminated or truncated:
            r.finish(
                reward,
                truncated=bool(truncated and not terminated),
                truncated_by="env" if truncated else None,
            )
            return None
        return observation

    def _context_full(self, r: _Run) -> None:
        """The context window is full: the episode ends with the env's own terminal outcome
        (``TextEnv.end_episode``: AppWorld runs its evaluator on the world as it is), or as a
        failure for envs without one."""
        end = env_attr(r.env, "end_episode")
        reward, info = 0.0, {"success": False}
        if end is not None:
            try:
                reward, info = end()
                check_reply("", info)
                check_terminal_reward(reward, env_attr(r.env, "reward_range"))
            except Exception as e:  # noqa: BLE001
                r.fail(self.env_id, "end_episode", e)
                return
        r.info.update(info)
        r.finish(reward, truncated=True, truncated_by="context", success=bool(info.get("success")))

    def close(self, runs: list[_Run]) -> None:
        def close_env(r: _Run) -> None:
            # Closing must not hide the episode's result.
            with contextlib.suppress(Exception):
                r.env.close()

        self._each(close_env, [(r,) for r in runs if r.env is not None])
        if self.pool is not None:
            self.pool.shutdown()


def _cancel_if_early_stop(
    runs: list[_Run], k: int, min_done_per_task: int, min_done_fraction: float
) -> None:
    if all(r.done for r in runs):
        return
    done = [sum(r.done for r in runs[i : i + k]) for i in range(0, len(runs), k)]
    if early_stop_reached(done, k, min_done_per_task, min_done_fraction):
        for r in runs:
            if not r.done:
                r.cancelled = True
                r.finish(0.0, cancelled=True)


def _check_arguments(
    k: int,
    task_ids: Sequence[str],
    engine: Engine,
    agent: LLMAgent,
    min_done_fraction: float,
    chunk_tokens: int | None,
) -> None:
    if k < 1:
        raise ValueError(f"k (samples per task) must be >= 1, got {k}")
    if not task_ids:
        raise ValueError("task_ids is empty; pass the tasks to roll out")
    if not 0 < min_done_fraction <= 1:
        raise ValueError(f"min_done_fraction must lie in (0, 1], got {min_done_fraction}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
    if agent.max_context > engine.max_model_len:
        raise ValueError(
            f"agent.max_context={agent.max_context} exceeds the engine's max_model_len="
            f"{engine.max_model_len}; lower max_context or start the engine with a longer context"
        )


def _env_workers(
    source: EnvSource, workers: EnvWorkers | int | None, timeout: float | None
) -> EnvWorkers | None:
    """The worker pool a collection's envs run in, or None for this process."""
    if not isinstance(source, str) or workers == 0:
        return None
    if isinstance(workers, EnvWorkers):
        pool = workers
    elif workers is None:
        pool = shared_env_workers(EnvLimits())
    else:
        pool = shared_env_workers(EnvLimits(workers=workers))
    check_portable(source)  # an env the workers cannot build is refused once, here
    if timeout is not None and not 0 < timeout < float("inf"):
        raise ValueError(f"env_timeout must be > 0 seconds, got {timeout}")
    return pool


def collect_rollouts(
    env: EnvSource,
    task_ids: Sequence[str],
    engine: Engine,
    agent: LLMAgent,
    *,
    k: int = 6,
    sampling: SamplingParams | None = None,
    adapter: str | None = None,
    early_stop: bool = True,
    min_done_per_task: int = 4,
    min_done_fraction: float = 0.9,
    chunk_tokens: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    group_offset: int = 0,
    keep_cancelled: bool = False,
    env_workers: EnvWorkers | int | None = None,
    env_timeout: float | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Rollouts:
    """Run ``k`` episodes of every task in ``task_ids`` and return them as :class:`Episode`\\ s.

    Args:
        env: a registered env id (made with ``gymnasium.make(env, **env_kwargs)``, one instance
            per episode) or a zero-argument factory (its env may be wrapped).
        engine, agent: the sampler and the conversation bookkeeping; ``agent.max_context`` must
            fit in ``engine.max_model_len``.
        sampling: temperature / top-p / top-k; ``max_tokens`` and stop ids come from the agent.
        adapter: LoRA adapter folder of the current policy version (None = base model).
        early_stop, min_done_per_task, min_done_fraction: the early-stopping rule.
        chunk_tokens: generate turns in chunks of this many tokens (None = whole turns).
        seed: episode ``i`` is reset with ``seed + i``.
        group_offset: group id of the first task (group ids are ``group_offset + task index``).
        keep_cancelled: also return cancelled episodes (``info["cancelled"] = True``).
        env_workers: where a registered env id runs: a pool of env worker processes
            (:class:`~entrogym.agents.env_workers.EnvWorkers`), a number of workers (the
            process-wide pool of that size; None = the default size), or 0 for this process
            (no time or memory limit). A factory ``env`` always runs in this process.
        env_timeout: seconds one env call may take in a worker (None = the pool's limit).
        should_stop: checked after every generation step and once all episodes ended; when it
            returns True the episodes are abandoned and :class:`RolloutsInterrupted` is raised.

    Failed episodes (env errors, see the module docstring) are returned too, with
    ``Episode.error`` set; one whose reset failed has no tokens.
    """
    _check_arguments(k, task_ids, engine, agent, min_done_fraction, chunk_tokens)
    t_start = time.perf_counter()
    runs = [
        _Run(i * k + j, tid, group_offset + i) for i, tid in enumerate(task_ids) for j in range(k)
    ]
    sampling = replace(sampling or SamplingParams(), stop_token_ids=agent.stop_token_ids)
    workers = _env_workers(env, env_workers, env_timeout)
    collection = _Collection(
        env, dict(env_kwargs or {}), engine, agent, sampling, adapter, chunk_tokens, workers,
        env_timeout,
    )  # fmt: skip
    try:
        collection.start(runs, seed)
        while True:
            # checked once more after the last step: episodes a signal failed (it may reach an
            # env's processes first) must not count as the env's errors
            if should_stop is not None and should_stop():
                raise RolloutsInterrupted("rollouts abandoned: the run was asked to stop")
            if not (active := [r for r in runs if not r.done]):
                break
            collection.step(active)
            if early_stop:
                _cancel_if_early_stop(runs, k, min_done_per_task, min_done_fraction)
    finally:
        collection.close(runs)
    return _rollouts(runs, collection, keep_cancelled, time.perf_counter() - t_start)


def _rollouts(
    runs: list[_Run], collection: _Collection, keep_cancelled: bool, wall_s: float
) -> Rollouts:
    env_id = collection.env_id or _env_id(collection.source, None)
    out = Rollouts(_episode(r, env_id) for r in runs if keep_cancelled or not r.cancelled)
    failed = [r for r in runs if r.error is not None]
    for r in failed:
        log_env_error_once(r.error_key, r.error or "")
    counted = [e for e in out if not e.failed]
    messages = list(dict.fromkeys(r.error_key.replace("\0", ": ") for r in failed))
    generate_s = collection.generate_s
    out.stats = {
        **collection.stats,
        "episodes": len(out),
        "cancelled": sum(r.cancelled for r in runs),
        "env_errors": len(failed),
        "env_error_messages": messages[:10],
        "truncated": sum(r.truncated for r in runs),
        "mean_reward": sum(e.reward for e in counted) / len(counted) if counted else 0.0,
        "generate_s": generate_s,
        "env_s": collection.env_s,
        "wall_s": wall_s,
        "tokens_per_s": collection.stats["generated_tokens"] / generate_s if generate_s else 0.0,
    }
    return out


def _episode(r: _Run, env_id: str) -> Episode:
    t = r.transcript
    info = {
        **r.info,
        "actions": list(t.actions) if t else [],
        "finish_reasons": list(t.finish_reasons) if t else [],
        "timing": {"generate_s": r.generate_s, "env_s": r.env_s, "wall_s": r.end - r.start},
        "prompt_tokens": t.prompt_len if t else 0,
    }
    return Episode(
        task_id=r.task_id,
        group_id=r.group_id,
        token_ids=list(t.token_ids) if t else [],
        action_mask=list(t.action_mask) if t else [],
        sampler_logprobs=list(t.logprobs) if t else [],
        reward=r.reward,
        info=info,
        num_turns=t.num_turns if t else 0,
        truncated=r.truncated,
        env_id=env_id,
        error=r.error,
    )
