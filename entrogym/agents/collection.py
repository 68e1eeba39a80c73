"""The episodes of one rollout collection and the envs, engine and agent that step them.

:class:`Collection` makes and resets every episode's env, batches one generation call across
the running episodes (:meth:`Collection.step`) and hands each finished turn to its env; an env
that raises or breaks the text-env contract fails its own episode only (:meth:`EpisodeRun.fail`).
The loop, early stopping and the returned :class:`~entrogym.agents.rollout.Rollouts` are
:func:`entrogym.agents.rollout.collect_rollouts`'s.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from entrogym.agents.agent import LLMAgent, Transcript, TurnEnd
from entrogym.agents.engines.base import Engine, SamplingParams
from entrogym.agents.env_workers import EnvWorkers, error_name
from entrogym.envs.base import env_attr, make_text_env
from entrogym.envs.contract import (
    EnvContractError,
    check_reply,
    check_step_reward,
    check_terminal_reward,
)
from entrogym.envs.tools import tools_problem

EnvSource = str | Callable[[], Any]
_TOOL_COUNTS = ("tool_calls", "tool_errors", "tool_tracebacks")
# Each collection's episodes get cache keys of their own: (collection number, episode index).
_COLLECTIONS = itertools.count()


@dataclass
class EpisodeRun:
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
    # per-turn rewards (a run with turn_rewards): what each turn was paid; None otherwise
    turn_rewards: list[float] | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    tool_tracebacks: list[dict[str, Any]] = field(default_factory=list)

    def count_tools(self, info: dict[str, Any]) -> dict[str, Any]:
        """Add a step's tool counts to the episode's; ``info`` without them."""
        self.tool_calls += int(info.get("tool_calls") or 0)
        self.tool_errors += int(info.get("tool_errors") or 0)
        for trace in info.get("tool_tracebacks") or []:
            self.tool_tracebacks.append({"turn": int(info.get("turn") or 0), **dict(trace)})
        return {k: v for k, v in info.items() if k not in _TOOL_COUNTS}

    def finish(self, reward: float = 0.0, truncated: bool = False, **info: Any) -> None:
        self.done, self.reward, self.truncated = True, float(reward), truncated
        self.info.update(info)
        self.end = time.perf_counter()

    def pay(self, reward: float) -> None:
        """Record a per-turn reward: the current turn's, or, when the env pays once more after
        the last turn was paid (``end_episode``), added to that turn's."""
        paid, turns = self.turn_rewards, self.transcript.num_turns if self.transcript else 0
        if paid is None:
            return
        if len(paid) < turns or not paid:
            paid.append(float(reward))
        else:
            paid[-1] += float(reward)

    def fail(self, env_id: str, where: str, error: BaseException) -> None:
        """End the episode as failed; the message names the env, the task and the error."""
        text = f"{error_name(error)}: {error}"
        self.error = f"env {env_id!r}, task {self.task_id!r}, {where}: {text}"
        self.error_key = f"{env_id}\0{where}\0{text}"
        self.finish(0.0, error=self.error, success=False)


def env_id_of(source: EnvSource, env: Any) -> str:
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


class Collection:
    """The envs, engine and agent of one :func:`collect_rollouts` call, and its counters.

    Env calls (make, reset, step, end_episode) of different episodes run side by side on
    ``pool`` threads when the envs live in several worker processes; with
    :meth:`step_overlapped` env steps run on ``env_pool`` threads while the next generation
    call runs. The agent's tokenizer is only used from the calling thread."""

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
        turn_rewards: bool = False,
    ) -> None:
        self.source, self.env_kwargs = source, env_kwargs
        self.turn_rewards = turn_rewards  # envs may pay a reward on every step
        self.engine, self.agent, self.adapter = engine, agent, adapter
        self.sampling, self.chunk_tokens = sampling, chunk_tokens
        self.workers, self.env_timeout = workers, env_timeout
        threads = workers.limits.workers if workers is not None else 1
        self.pool = ThreadPoolExecutor(threads) if threads > 1 else None
        # env steps beside generation (step_overlapped): side by side as many as the workers
        self.env_pool = ThreadPoolExecutor(threads, thread_name_prefix="entrogym-env")
        self.in_env: list[tuple[EpisodeRun, TurnEnd, Future[str | None]]] = []
        self.stats: dict[str, Any] = {"steps": 0, "generate_calls": 0, "generated_tokens": 0}
        self.generate_s = self.env_s = 0.0
        self.env_id = source if isinstance(source, str) else ""
        # an Engine keeps each episode's cache between its turns under the episode's key;
        # other objects with a generate method (wrappers, test doubles) get no keys
        self.keyed = isinstance(engine, Engine)
        self.number = next(_COLLECTIONS)
        self.kept: set[int] = set()  # episodes the engine may hold a cache for

    def cache_key(self, r: EpisodeRun) -> tuple[str, int, int]:
        return ("rollout", self.number, r.index)

    def forget_ended(self, runs: list[EpisodeRun]) -> None:
        """Tell the engine to drop the kept caches of the episodes that ended."""
        ended = [r for r in runs if r.done and r.index in self.kept]
        if ended:
            self.engine.forget([self.cache_key(r) for r in ended])
            self.kept.difference_update(r.index for r in ended)

    def _each(self, fn: Callable[..., Any], items: Sequence[Any]) -> list[Any]:
        """``fn(*item)`` for every item, on the pool's threads when there is one."""
        if self.pool is None or len(items) < 2:
            return [fn(*item) for item in items]
        return list(self.pool.map(lambda item: fn(*item), items))

    def make_env(self, r: EpisodeRun) -> Any:
        if self.workers is not None:
            assert isinstance(self.source, str)
            return self.workers.make(self.source, self.env_kwargs, r.group_id, self.env_timeout)
        if isinstance(self.source, str):
            return make_text_env(self.source, **self.env_kwargs)
        return self.source()

    def start(self, runs: list[EpisodeRun], seed: int) -> None:
        """Make every run's env and reset it to its task, then start the agents' transcripts."""
        t0 = time.perf_counter()
        if self.workers is not None:
            self.workers.warm({r.group_id for r in runs})
        starts = self._each(self._reset, [(r, seed) for r in runs])
        for r, first in zip(runs, starts, strict=True):
            if first is not None:
                observation, tools, demonstration = first
                # a prompt over max_context is a setup error, not the env's: it raises
                r.transcript = self.agent.start(observation, r.task_id, tools, demonstration)
        self.env_s += time.perf_counter() - t0

    def _reset(self, r: EpisodeRun, seed: int) -> tuple[str, Any, Any] | None:
        """The run's first observation, its tools and demonstration (reset info of an env with
        tools), or None when making or resetting its env failed."""
        t0 = time.perf_counter()
        try:
            r.env = self.make_env(r)
            self.env_id = self.env_id or env_id_of(self.source, r.env)
            observation, info = r.env.reset(seed=seed + r.index, options={"task_id": r.task_id})
            check_reply(observation, info)
            info = dict(info)
            tools, demonstration = info.pop("tools", None), info.pop("demonstration", None)
            problem = tools_problem(tools, demonstration)
            if problem is not None:
                raise EnvContractError(problem)
        except Exception as e:  # noqa: BLE001  (one broken env must not end the batch)
            r.fail(self.env_id or env_id_of(self.source, r.env), "reset", e)
            return None
        finally:
            r.env_s += time.perf_counter() - t0
        r.info.update(info)
        if self.turn_rewards:
            r.turn_rewards = []
        return observation, tools, demonstration

    def step(self, active: list[EpisodeRun]) -> None:
        """One batched generation call for the running episodes, then the envs of the turns
        that ended."""
        ended = self._generate(active)
        t0 = time.perf_counter()
        self._feedback(ended, self._each(self._env_turn, ended))
        self.env_s += time.perf_counter() - t0
        self.stats["steps"] += 1

    def step_overlapped(self, ready: list[EpisodeRun]) -> None:
        """One batched generation call for ``ready`` while the envs of the turns the previous
        call ended step in the background; then those episodes rejoin (the next call takes
        them) and the envs of this call's ended turns start. Which episodes a call holds
        follows from the completions alone, never from how long an env took, so a seeded
        rollout samples the same episodes every time."""
        ended = self._generate(ready) if ready else []
        started = [(r, end, self.env_pool.submit(self._env_turn, r, end)) for r, end in ended]
        self.settle()
        self.in_env = started
        self.stats["steps"] += bool(ready)

    def settle(self) -> None:
        """Wait for the env steps in the background and append their feedback."""
        if not self.in_env:
            return
        t0 = time.perf_counter()
        pending, self.in_env = self.in_env, []
        feedback = [future.result() for _, _, future in pending]
        self._feedback([(r, end) for r, end, _ in pending], feedback)
        self.env_s += time.perf_counter() - t0

    def stepping(self, r: EpisodeRun) -> bool:
        """Whether ``r``'s env is stepping in the background."""
        return any(r is other for other, _, _ in self.in_env)

    def _generate(self, active: list[EpisodeRun]) -> list[tuple[EpisodeRun, TurnEnd]]:
        """One batched generation call; returns the turns that ended."""
        params = []
        for r in active:
            budget = self.agent.turn_budget(r.transcript)
            params.append(
                replace(self.sampling, max_tokens=min(budget, self.chunk_tokens or budget))
            )
        t0 = time.perf_counter()
        prompts = [r.transcript.token_ids for r in active]
        if self.keyed:
            keys = [self.cache_key(r) for r in active]
            completions = self.engine.generate(prompts, params, self.adapter, cache_keys=keys)
            self.kept.update(r.index for r in active)
        else:
            completions = self.engine.generate(prompts, params, self.adapter)
        dt = time.perf_counter() - t0
        self.generate_s += dt
        self.stats["generate_calls"] += 1
        ended: list[tuple[EpisodeRun, TurnEnd]] = []
        for r, c in zip(active, completions, strict=True):
            r.generate_s += dt
            self.stats["generated_tokens"] += len(c.token_ids)
            end = self.agent.add_completion(r.transcript, c)
            if end is not None:
                ended.append((r, end))
        return ended

    def _feedback(
        self, ended: list[tuple[EpisodeRun, TurnEnd]], feedback: list[str | None]
    ) -> None:
        """Append the envs' answers to the episodes that go on (here: the tokenizer)."""
        for (r, _), observation in zip(ended, feedback, strict=True):
            if observation is not None and not self.agent.add_feedback(r.transcript, observation):
                self._end_early(r, "context")

    def _env_turn(self, r: EpisodeRun, end: TurnEnd) -> str | None:
        """Hand a finished turn's action to the env. Returns the env's answer when the episode
        goes on (the caller appends it), None when it ended."""
        if end.limit == "context":
            self._end_early(r, "context")
            return None
        if end.limit == "turn" and self.agent.on_turn_budget == "truncate":
            self._end_unstepped(r, truncated=True, truncated_by=end.limit)
            return None
        if not end.text:
            self._end_unstepped(r, empty_action=True)  # envs take at least one character
            return None
        t0 = time.perf_counter()
        try:
            if end.limit == "turn":
                flag = env_attr(r.env, "flag_action_truncated")
                if flag is not None:
                    flag()
            observation, reward, terminated, truncated, info = r.env.step(end.text)
            check_reply(observation, info)
            rewards = env_attr(r.env, "reward_range")
            check_step_reward(reward, terminated or truncated, rewards, self.turn_rewards)
            r.pay(reward)
            if terminated or truncated:
                reward = self._return(r, reward)
        except Exception as e:  # noqa: BLE001
            r.fail(self.env_id, "step", e)
            return None
        finally:
            r.env_s += time.perf_counter() - t0
        r.info.update(r.count_tools(info))
        if terminated or truncated:
            r.finish(
                reward,
                truncated=bool(truncated and not terminated),
                truncated_by="env" if truncated else None,
            )
            return None
        max_turns = self.agent.max_turns
        if (
            max_turns is not None
            and r.transcript is not None
            and r.transcript.num_turns >= max_turns
        ):
            self._end_early(r, "max_turns")
            return None
        return observation

    def _end_unstepped(self, r: EpisodeRun, **info: Any) -> None:
        """End an episode whose last turn the env never saw (cut at the turn budget, or
        empty) as a failure: that turn earns 0 (turns before keep what they were paid)."""
        r.pay(0.0)
        try:
            reward = self._return(r, 0.0)
        except EnvContractError as e:
            r.fail(self.env_id, "step", e)
            return
        r.finish(reward, success=False, **info)

    def _return(self, r: EpisodeRun, reward: float) -> float:
        """The episode's reward: ``reward`` (the last step's), or with per-turn rewards the
        return, the sum of every turn's, which must lie within the env's ``reward_range``."""
        if r.turn_rewards is None:
            return reward
        total = float(sum(r.turn_rewards))
        check_terminal_reward(total, env_attr(r.env, "reward_range"))
        return total

    def _end_early(self, r: EpisodeRun, by: str) -> None:
        """The context window is full (``by="context"``) or the agent's ``max_turns`` is
        reached: the episode ends with the env's own terminal outcome (``TextEnv.end_episode``:
        AppWorld runs its evaluator on the world as it is), or as a failure for envs without
        one."""
        end = env_attr(r.env, "end_episode")
        reward, info = 0.0, {"success": False}
        try:
            if end is not None:
                reward, info = end()
                check_reply("", info)
                check_terminal_reward(reward, env_attr(r.env, "reward_range"))
            r.pay(reward)
            reward = self._return(r, reward)
        except Exception as e:  # noqa: BLE001
            r.fail(self.env_id, "end_episode", e)
            return
        r.info.update(r.count_tools(info))
        r.finish(reward, truncated=True, truncated_by=by, success=bool(info.get("success")))

    def close(self, runs: list[EpisodeRun]) -> None:
        self.env_pool.shutdown()  # the env steps in the background end before their envs close
        self.in_env = []
        if self.kept:
            self.engine.forget([self.cache_key(r) for r in runs if r.index in self.kept])
            self.kept.clear()

        def close_env(r: EpisodeRun) -> None:
            # Closing must not hide the episode's result.
            with contextlib.suppress(Exception):
                r.env.close()

        self._each(close_env, [(r,) for r in runs if r.env is not None])
        if self.pool is not None:
            self.pool.shutdown()
