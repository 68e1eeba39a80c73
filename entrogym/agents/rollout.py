"""Rollout collection: K samples per task, all episodes stepped together.

Every step batches one generation call across all running episodes, then steps the envs whose
turn ended. With ``overlap_env`` (the default where envs run in env worker processes) those
env steps run in the background while the next call generates for the other episodes, and
their episodes rejoin the call after that: an env's latency is hidden behind generation where
a call lasts longer than an env step. Which episodes a call holds depends on the completions
only, not on timings, so a seeded rollout is reproducible either way. Whole turns end every
running episode's turn in each call, so the overlap comes with ``chunk_tokens``, where turns
end in different calls. The engine keeps each episode's cache between its calls
(``Engine.generate``'s ``cache_keys``), so a chunk or a turn prefills only what it adds. Early stopping (paper appendix "Training") is checked after every step: once at
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
before the last step (unless ``turn_rewards``), is not finite or lies outside the env's
``reward_range``) fails that episode only. It comes back with reward 0 and ``Episode.error``
(env id, task id, message), is counted in ``stats["env_errors"]``, its message goes to stderr
once, the trainer leaves it out, and :func:`check_env_errors` stops a run whose failed share
is too high. Env attributes are reached with ``env.get_wrapper_attr``, so envs wrapped in
Gymnasium wrappers work.

A tool call that goes wrong (an unknown tool, bad arguments, a tool that raises, a turn the
agent could not parse) is not an env error: the env answers with what went wrong and the
episode goes on. Each episode counts them (``info["tool_errors"]``, beside
``info["tool_calls"]``); the tracebacks of tools that raised go to ``tool_error_log`` (a JSON
lines file in the run folder), not to the console. ``info["end_reason"]`` says what ended an
episode: ``done``, ``max_turns`` (the env's limit or the agent's), ``turn_budget``,
``context``, ``error`` or ``cancelled``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from entrogym.agents.agent import LLMAgent
from entrogym.agents.collection import Collection, EnvSource, EpisodeRun, env_id_of
from entrogym.agents.engines.base import Engine, SamplingParams
from entrogym.agents.env_workers import EnvLimits, EnvWorkers, check_portable, shared_env_workers
from entrogym.agents.episode import (
    EnvErrorBudgetExceeded,
    Episode,
    check_env_errors,
    log_env_error_once,
)

__all__ = [
    "EnvErrorBudgetExceeded",
    "Episode",
    "Rollouts",
    "RolloutsInterrupted",
    "check_env_errors",
    "collect_rollouts",
    "early_stop_reached",
]


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


class RolloutsInterrupted(Exception):
    """``should_stop`` asked the collection to stop (the trainer received SIGTERM or SIGINT);
    the episodes in progress were abandoned."""


def _early_stop_due(
    runs: list[EpisodeRun], k: int, min_done_per_task: int, min_done_fraction: float
) -> bool:
    """Whether episodes are still running and the early-stopping rule says to cancel them."""
    if all(r.done for r in runs):
        return False
    done = [sum(r.done for r in runs[i : i + k]) for i in range(0, len(runs), k)]
    return early_stop_reached(done, k, min_done_per_task, min_done_fraction)


def _cancel_if_early_stop(
    runs: list[EpisodeRun], k: int, min_done_per_task: int, min_done_fraction: float
) -> None:
    if _early_stop_due(runs, k, min_done_per_task, min_done_fraction):
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
    on_progress: Callable[[int], None] | None = None,
    tool_error_log: str | Path | None = None,
    turn_rewards: bool = False,
    overlap_env: bool | None = None,
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
        on_progress: told how many episodes have ended (done, failed or cancelled), once the
            envs are reset and after every generation step (a progress bar's count).
        tool_error_log: a JSON lines file the tracebacks of tools that raised are appended to
            (one line each, with the env, task and turn); None = kept in the episodes'
            ``info["tool_tracebacks"]``.
        turn_rewards: take per-turn rewards (:mod:`entrogym.envs.contract`): an env may pay a
            finite reward on every step, each episode's ``info["turn_rewards"]`` lists what
            each of its turns was paid (a turn the env never saw earns 0; a reward paid after
            the last turn, by ``end_episode``, counts for it) and its reward is the return,
            their sum, within the env's ``reward_range``. Off: rewards are terminal.
        overlap_env: step the envs of the turns a generation call ended while the next call
            runs for the other episodes, which rejoin the call after (the module docstring).
            None: where the envs run in env worker processes; True: in this process too
            (its envs are then stepped from a background thread); False: never.

    Failed episodes (env errors, see the module docstring) are returned too, with
    ``Episode.error`` set; one whose reset failed has no tokens.
    """
    _check_arguments(k, task_ids, engine, agent, min_done_fraction, chunk_tokens)
    t_start = time.perf_counter()
    runs = [
        EpisodeRun(i * k + j, tid, group_offset + i)
        for i, tid in enumerate(task_ids)
        for j in range(k)
    ]
    sampling = replace(sampling or SamplingParams(), stop_token_ids=agent.stop_token_ids)
    workers = _env_workers(env, env_workers, env_timeout)
    collection = Collection(
        env, dict(env_kwargs or {}), engine, agent, sampling, adapter, chunk_tokens, workers,
        env_timeout, turn_rewards,
    )  # fmt: skip
    try:
        collection.start(runs, seed)
        overlap = workers is not None if overlap_env is None else overlap_env
        while True:
            if on_progress is not None:
                on_progress(sum(r.done for r in runs))
            # checked once more after the last step: episodes a signal failed (it may reach an
            # env's processes first) must not count as the env's errors
            if should_stop is not None and should_stop():
                raise RolloutsInterrupted("rollouts abandoned: the run was asked to stop")
            active = [r for r in runs if not r.done and not collection.stepping(r)]
            if not active and not collection.in_env:
                break
            if overlap:
                collection.step_overlapped(active)
            else:
                collection.step(active)
            if early_stop and _early_stop_due(runs, k, min_done_per_task, min_done_fraction):
                collection.settle()  # the envs in the background finish their step first
                _cancel_if_early_stop(runs, k, min_done_per_task, min_done_fraction)
            collection.forget_ended(runs)
    finally:
        collection.close(runs)
    if tool_error_log is not None:
        _log_tool_errors(Path(tool_error_log), runs, collection.env_id)
    return _rollouts(runs, collection, keep_cancelled, time.perf_counter() - t_start,
                     keep_tracebacks=tool_error_log is None)  # fmt: skip


def _log_tool_errors(path: Path, runs: list[EpisodeRun], env_id: str) -> None:
    """Append the tracebacks of the tools that raised to ``path``; a file that cannot be
    written costs the tracebacks (one line on stderr), not the rollouts."""
    lines = [
        json.dumps({"env": env_id, "task_id": r.task_id, "episode": r.index, **trace})
        for r in runs
        for trace in r.tool_tracebacks
    ]
    if not lines:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as exc:
        print(f"entrogym: cannot write tool tracebacks to {path}: {exc}", file=sys.stderr)
    for r in runs:
        r.tool_tracebacks.clear()


def _rollouts(
    runs: list[EpisodeRun],
    collection: Collection,
    keep_cancelled: bool,
    wall_s: float,
    keep_tracebacks: bool = True,
) -> Rollouts:
    env_id = collection.env_id or env_id_of(collection.source, None)
    out = Rollouts(
        _episode(r, env_id, keep_tracebacks) for r in runs if keep_cancelled or not r.cancelled
    )
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
        "tool_calls": sum(r.tool_calls for r in runs),
        "tool_errors": sum(r.tool_errors for r in runs),
        "mean_reward": sum(e.reward for e in counted) / len(counted) if counted else 0.0,
        "generate_s": generate_s,
        "env_s": collection.env_s,
        "wall_s": wall_s,
        "tokens_per_s": collection.stats["generated_tokens"] / generate_s if generate_s else 0.0,
    }
    return out


_END_REASONS = {"context": "context", "turn": "turn_budget", "env": "max_turns",
                "max_turns": "max_turns"}  # fmt: skip


def end_reason(r: EpisodeRun) -> str:
    """What ended the episode (one of :data:`END_REASONS`)."""
    if r.error is not None:
        return "error"
    if r.cancelled:
        return "cancelled"
    return _END_REASONS.get(r.info.get("truncated_by") or "", "done")


END_REASONS = ("done", "max_turns", "turn_budget", "context", "error", "cancelled")


def _episode(r: EpisodeRun, env_id: str, keep_tracebacks: bool = True) -> Episode:
    t = r.transcript
    info = {
        **r.info,
        "end_reason": end_reason(r),
        "tool_calls": r.tool_calls,
        "tool_errors": r.tool_errors,
        **(
            {"tool_tracebacks": list(r.tool_tracebacks)}
            if keep_tracebacks and r.tool_tracebacks
            else {}
        ),  # fmt: skip
        "actions": list(t.actions) if t else [],
        "finish_reasons": list(t.finish_reasons) if t else [],
        "timing": {"generate_s": r.generate_s, "env_s": r.env_s, "wall_s": r.end - r.start},
        "prompt_tokens": t.prompt_len if t else 0,
    }
    if r.turn_rewards is not None:
        info["turn_rewards"] = list(r.turn_rewards)
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
