"""Envs in worker processes: every ``reset`` and ``step`` has a time limit, every env a memory
limit, and an env that hangs, leaks or crashes fails its own episode instead of the run.

:class:`EnvWorkers` keeps ``workers`` processes (:class:`entrogym.workers.WorkerProcess`,
pickle messages). :meth:`EnvWorkers.make` builds an env in one of them and returns a
:class:`RemoteEnv`, which the rollout loop uses like the env itself. The episodes of one task
share a worker (a task that hangs usually hangs in all its samples); different tasks spread
over the workers, whose calls run in parallel.

- **Time.** A call (``make``, ``reset``, ``step``, ``end_episode``, ``close``) with no reply
  within ``timeout_s`` raises :class:`EnvTimeout`: the worker is killed and the next env gets
  a fresh one.
- **Death.** A worker that exits (a crash, ``os._exit``, the OOM killer) raises
  :class:`EnvWorkerDied`, naming how it ended; it is replaced the same way.
- **Memory.** Each worker's address space is capped at ``memory_mb`` (soft ``RLIMIT_AS``): an
  allocation past it raises MemoryError inside the env, which fails that call; the worker
  then takes no new envs and is stopped once its envs are closed.
- **Neighbours.** The other envs a killed worker held are lost with it: their next call raises
  :class:`EnvWorkerLost`, naming the task whose call brought the worker down. With at least
  as many workers as tasks in a batch, no episode shares a worker with another task's.

An env is built in the worker from its Gymnasium id: ``module:id`` imports ``module`` there
first, as ``gymnasium.make`` does, and an id registered in the caller's process with a class
entry point (``gym.register(id, entry_point=MyEnv)``) is re-registered in the worker from its
pickled spec, which imports the class's module. A class the worker cannot import (defined in a
function, or in the ``__main__`` script) is refused with a message saying what to do.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pickle
import sys
import threading
from dataclasses import dataclass
from typing import Any

from entrogym.workers import TIMED_OUT, WorkerDied, WorkerProcess, serve

DEFAULT_ENV_WORKERS = 4
DEFAULT_ENV_TIMEOUT_S = 300.0
DEFAULT_ENV_MEMORY_MB = 4096
MIN_ENV_MEMORY_MB = 256  # a Python process with gymnasium and numpy needs about this much
STARTUP_TIMEOUT_S = 120.0  # a cold worker imports gymnasium and numpy (seconds on a busy CPU)
_ENV_METHODS = ("end_episode", "flag_action_truncated")  # optional members, called remotely
_MEMORY_VAR = "ENTROGYM_ENV_WORKER_MEMORY_MB"


class EnvTimeout(TimeoutError):
    """An env call did not return within the time limit; its worker was killed."""


class EnvWorkerDied(RuntimeError):
    """The worker process running the env exited during a call."""


class EnvWorkerLost(RuntimeError):
    """The env was lost with its worker, which another env's call brought down."""


class RemoteError(Exception):
    """An exception raised inside a worker, by type name and message (the exception object
    itself may not survive pickling). ``remote_type`` is that type's name."""

    def __init__(self, remote_type: str, message: str) -> None:
        super().__init__(message)
        self.remote_type = remote_type


def error_name(error: BaseException) -> str:
    """The name of ``error``'s type, or of the type a worker raised for a RemoteError."""
    return getattr(error, "remote_type", None) or type(error).__name__


@dataclass(frozen=True)
class EnvLimits:
    """How envs are isolated: ``workers`` processes (0 = in the caller's process, with no time
    or memory limit), ``timeout_s`` per call, ``memory_mb`` of address space per worker."""

    workers: int = DEFAULT_ENV_WORKERS
    timeout_s: float = DEFAULT_ENV_TIMEOUT_S
    memory_mb: int = DEFAULT_ENV_MEMORY_MB

    def __post_init__(self) -> None:
        check_env_limits(self.workers, self.timeout_s, self.memory_mb)


def check_env_limits(workers: Any, timeout_s: Any, memory_mb: Any) -> None:
    """ValueError naming the option for a bad ``env_workers``, ``env_timeout`` or
    ``env_max_memory_mb``."""
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"env_workers must be >= 0, got {workers}")
    if not isinstance(timeout_s, int | float) or not 0 < timeout_s < float("inf"):
        raise ValueError(f"env_timeout must be > 0 seconds, got {timeout_s}")
    if not isinstance(memory_mb, int) or memory_mb < MIN_ENV_MEMORY_MB:
        raise ValueError(f"env_max_memory_mb must be >= {MIN_ENV_MEMORY_MB}, got {memory_mb}")


class _Host:
    """One worker process and the envs it holds. Requests go through :meth:`request` with
    ``lock`` held, one at a time."""

    def __init__(self, memory_mb: int) -> None:
        self.proc = WorkerProcess(
            "entrogym.agents.env_workers:worker_main",
            codec="pickle",
            quiet=False,  # an env's own prints and warnings reach the user
            env={_MEMORY_VAR: str(memory_mb)},
        )
        self.lock = threading.Lock()
        self.envs: set[int] = set()
        self.lost: str | None = None  # why the worker was stopped, once it was
        self.retiring = False  # takes no new env; stopped when its last one closes
        self._ready = False

    @property
    def usable(self) -> bool:
        return self.lost is None and not self.retiring

    def request(self, message: Any, timeout: float) -> Any:
        """The reply to ``message`` (TIMED_OUT after ``timeout`` s); the first request also
        waits for the worker's start-up, which has its own, longer limit."""
        if not self._ready:
            self.proc.wait_ready(STARTUP_TIMEOUT_S, "env worker")
            self._ready = True
        return self.proc.call(message, timeout)

    def stop(self, why: str) -> None:
        self.lost = why
        self.proc.kill()


class EnvWorkers:
    """A pool of env worker processes (see the module docstring). Thread-safe."""

    def __init__(self, limits: EnvLimits | None = None) -> None:
        self.limits = limits or EnvLimits()
        if self.limits.workers < 1:
            raise ValueError("EnvWorkers needs workers >= 1; run envs in-process instead")
        self._slots: list[_Host | None] = [None] * self.limits.workers
        self._lock = threading.Lock()
        self._handles = itertools.count()

    def _host(self, slot: int) -> _Host:
        """The worker of ``slot``, started if there is none that takes envs."""
        with self._lock:
            host = self._slots[slot]
            if host is None or not host.usable:
                host = self._slots[slot] = _Host(self.limits.memory_mb)
            return host

    def warm(self, groups: set[int]) -> None:
        """Start the workers of these groups now, side by side (each start takes a moment)."""
        for slot in {g % self.limits.workers for g in groups}:
            self._host(slot)

    def make(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        group: int = 0,
        timeout_s: float | None = None,
    ) -> RemoteEnv:
        """Build ``gymnasium.make(env_id, **env_kwargs)`` in worker ``group % workers``."""
        spec = check_portable(env_id)
        host = self._host(group % self.limits.workers)
        env = RemoteEnv(self, host, next(self._handles), env_id, timeout_s or self.limits.timeout_s)
        host.envs.add(env.handle)
        try:
            info = env._call("make", env_id, dict(env_kwargs or {}), spec, list(sys.path))
        except BaseException:
            self._closed(host, env.handle)
            raise
        env.reward_range, env._methods = info["reward_range"], set(info["methods"])
        return env

    def _lost(self, host: _Host, why: str) -> None:
        """``host`` is gone (killed or dead): its envs fail from now on, its slot refills."""
        host.stop(why)
        with self._lock:
            self._slots = [None if h is host else h for h in self._slots]

    def _closed(self, host: _Host, handle: int) -> None:
        host.envs.discard(handle)
        if host.retiring and not host.envs and host.lost is None:
            self._lost(host, "retired after a MemoryError")

    def close(self) -> None:
        """Stop every worker."""
        with self._lock:
            hosts, self._slots = self._slots, [None] * self.limits.workers
        for host in hosts:
            if host is not None:
                host.stop("the pool was closed")

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without touching their processes."""
        for host in self._slots:
            if host is not None:
                host.proc.close_pipes()
        self._slots = [None] * self.limits.workers
        self._lock = threading.Lock()


class RemoteEnv:
    """An env living in an env worker, used like the env: ``reset``, ``step``, ``close`` and
    ``get_wrapper_attr`` for ``reward_range``, ``end_episode`` and ``flag_action_truncated``."""

    def __init__(
        self, pool: EnvWorkers, host: _Host, handle: int, env_id: str, timeout_s: float
    ) -> None:
        self.pool, self.host, self.handle = pool, host, handle
        self.env_id, self.timeout_s = env_id, timeout_s
        self.task_id: str | None = None
        self.reward_range: Any = None
        self._methods: set[str] = set()
        self._closed = False

    @property
    def pid(self) -> int:
        """The worker process's pid."""
        return self.host.proc.pid

    def _call(self, op: str, *args: Any) -> Any:
        host = self.host
        with host.lock:
            if host.lost is not None:
                raise EnvWorkerLost(f"its env worker was stopped: {host.lost}")
            try:
                reply = host.request((op, self.handle, args), self.timeout_s)
            except RuntimeError as exc:  # the worker did not start
                self.pool._lost(host, str(exc))
                raise
            except WorkerDied:
                why = f"the env worker process died ({host.proc.exit_description()})"
                self.pool._lost(host, f"task {self.task_id!r}'s {op}: {why}")
                raise EnvWorkerDied(f"{why}; it was replaced") from None
            if reply is TIMED_OUT:
                self.pool._lost(host, f"task {self.task_id!r}'s {op} timed out")
                raise EnvTimeout(
                    f"no reply within {self.timeout_s:g} s (--env-timeout); its env worker was "
                    "stopped and replaced"
                )
        status, value = reply
        if status == "ok":
            return value
        remote_type, message = value
        if remote_type == "MemoryError":
            host.retiring = True
            message = (
                f"{message or 'out of memory'} (the env worker's address space is limited to "
                f"{self.pool.limits.memory_mb} MB, --env-max-memory-mb)"
            )
        raise RemoteError(remote_type, message)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.task_id = (options or {}).get("task_id", self.task_id)
        return self._call("reset", seed, options)

    def step(self, action: str) -> Any:
        return self._call("step", action)

    def get_wrapper_attr(self, name: str) -> Any:
        if name == "reward_range":
            if self.reward_range is None:
                raise AttributeError(name)
            return self.reward_range
        if name in self._methods:
            return lambda: self._call(name)
        raise AttributeError(f"{self.env_id} has no attribute {name!r}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.host.lost is None:
                self._call("close")
        finally:
            self.pool._closed(self.host, self.handle)


def check_portable(env_id: str) -> bytes | None:
    """``env_id``'s registration, pickled, for a worker where the id is not registered; None
    for a ``module:id`` (the worker imports ``module``, which registers it) or an unknown id
    (``gymnasium.make`` in the worker names the problem)."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if module:
        return None
    try:
        spec = gym.spec(name)
    except gym.error.Error:
        return None
    entry = spec.entry_point
    if callable(entry):
        where = getattr(entry, "__module__", "") or ""
        qualname = getattr(entry, "__qualname__", "") or ""
        place = "the __main__ script" if where == "__main__" else "a function"
        if where == "__main__" or "<locals>" in qualname:
            raise ValueError(
                f"env {env_id!r} cannot be built in an env worker process: its entry point "
                f"{qualname} is defined in {place}. Define it in an importable module, or run "
                "envs in this process with --env-workers 0 (no time or memory limit)"
            )
    try:
        return pickle.dumps(spec)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same
        raise ValueError(
            f"env {env_id!r} cannot be sent to an env worker process ({exc}); register it "
            "with an importable entry point, or run envs in this process with --env-workers 0"
        ) from exc


_SHARED: dict[tuple[int, int], EnvWorkers] = {}
_SHARED_LOCK = threading.Lock()


def shared_env_workers(limits: EnvLimits) -> EnvWorkers:
    """The process-wide pool of ``limits.workers`` workers with ``limits.memory_mb`` each: its
    workers outlive one rollout or one run, so their start-up is paid once. Callers pass
    their own call timeout to :meth:`EnvWorkers.make` (else the first caller's applies)."""
    key = (limits.workers, limits.memory_mb)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            pool = _SHARED[key] = EnvWorkers(limits)
    return pool


def shutdown() -> None:
    """Stop the shared pools' workers (also done at interpreter exit)."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.close()


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for pool in _SHARED.values():
        pool.forget()
    _SHARED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ----------------------------------------------------------------------------- the worker's side

_ENVS: dict[int, Any] = {}


def _build(env_id: str, kwargs: dict[str, Any], spec: bytes | None) -> Any:
    import gymnasium as gym

    from entrogym.envs.base import make_text_env

    module, _, name = env_id.rpartition(":")
    if spec is not None and name not in gym.registry:
        registered = pickle.loads(spec)  # noqa: S301 - from our own parent
        if name not in gym.registry:  # unpickling may have imported the registering module
            gym.register(**{k: v for k, v in vars(registered).items() if k in _REGISTER_KEYS})
    return make_text_env(env_id, **kwargs)


_REGISTER_KEYS = (
    "id",
    "entry_point",
    "reward_threshold",
    "nondeterministic",
    "max_episode_steps",
    "order_enforce",
    "disable_env_checker",
    "kwargs",
    "additional_wrappers",
    "vector_entry_point",
)


def _describe(env: Any) -> dict[str, Any]:
    from entrogym.envs.base import env_attr

    reward_range = env_attr(env, "reward_range")
    methods = [m for m in _ENV_METHODS if callable(env_attr(env, m))]
    return {"reward_range": None if reward_range is None else tuple(reward_range),
            "methods": methods}  # fmt: skip


def _handle(message: Any) -> tuple[str, Any]:
    op, handle, args = message
    try:
        if op == "make":
            env_id, kwargs, spec, path = args
            sys.path[:] = path  # the caller's: its modules, and the envs registered in them
            env = _ENVS[handle] = _build(env_id, kwargs, spec)
            return "ok", _describe(env)
        env = _ENVS[handle]
        if op == "reset":
            seed, options = args
            return "ok", env.reset(seed=seed, options=options)
        if op == "step":
            return "ok", env.step(*args)
        if op in _ENV_METHODS:
            return "ok", env.get_wrapper_attr(op)()
        if op == "close":
            del _ENVS[handle]
            env.close()
            return "ok", None
        raise ValueError(f"unknown env worker request {op!r}")
    except BaseException as exc:  # noqa: BLE001 - the env's errors are the caller's data
        return "error", (type(exc).__name__, str(exc))


def _unsendable(reply: Any, error: BaseException) -> tuple[str, Any]:
    """The reply when the env's answer cannot be pickled (or memory ran out doing it)."""
    return "error", (
        "EnvContractError",
        f"the env's reply cannot be sent to the trainer ({type(error).__name__}: {error})",
    )


def worker_main() -> None:
    """Entry point of an env worker process (pickle messages on stdin/stdout)."""
    import gymnasium  # noqa: F401  (before "ready": its import never counts against a call)

    import entrogym  # noqa: F401  (registers the built-in ids)

    memory_mb = int(os.environ.get(_MEMORY_VAR, str(DEFAULT_ENV_MEMORY_MB)))
    serve(_handle, codec="pickle", memory_mb=memory_mb, unsendable=_unsendable)
