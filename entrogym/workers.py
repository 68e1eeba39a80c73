"""Worker subprocesses: a request goes in, a reply comes back before a deadline, or the worker
is killed.

Work that may hang, crash or eat memory runs in a child process built on this module: grading
(:mod:`entrogym.envs.grader_pool`, sympy can spend hours on ``9^{9^{9^{9}}}``) and envs
(:mod:`entrogym.agents.env_workers`, a user's env may block or leak). ``signal.alarm`` only
works in a main thread and cannot stop C code, so a call that runs past its deadline kills the
worker; the caller starts another.

A worker is a fresh ``python -c`` process (never a fork of the caller, which may hold CUDA,
vLLM or many threads) speaking length-prefixed messages over its stdin and stdout, encoded as
JSON or pickle. Its side (:func:`serve`) sets an address-space limit, keeps the protocol on a
private copy of stdout (libraries that print go to stderr) and exits when its parent is gone.

SIGINT and SIGTERM never stop a worker: Ctrl-C reaches the whole process group and schedulers
(SLURM, Kubernetes) signal every process of a job, so the caller alone decides when to stop
(the trainer checkpoints first) and then kills its workers. A worker ignores both from its
first instruction: they stay blocked from the fork until it has set them to ``SIG_IGN``, so a
signal sent while it starts (its imports take seconds) cannot kill it either.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Codec = Literal["json", "pickle"]
_FRAME = struct.Struct(">I")
TIMED_OUT = object()  # what :meth:`WorkerProcess.receive` returns at its deadline
_CALLER_STOPS = (signal.SIGINT, signal.SIGTERM)  # the caller's to act on, never a worker's
# The worker's first statements: ignore the caller's signals, then take any that came while
# they were blocked (setting SIG_IGN discards a pending signal).
_PRELUDE = (
    "import signal; s = (signal.SIGINT, signal.SIGTERM); "
    "[signal.signal(n, signal.SIG_IGN) for n in s]; signal.pthread_sigmask(signal.SIG_UNBLOCK, s); "
)


class WorkerDied(EOFError):
    """The worker process exited (or closed its pipes) before it replied."""


def _encode(obj: Any, codec: Codec) -> bytes:
    if codec == "json":
        return json.dumps(obj).encode()
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _decode(data: bytes, codec: Codec) -> Any:
    return json.loads(data) if codec == "json" else pickle.loads(data)  # noqa: S301 (our child)


class WorkerProcess:
    """One worker subprocess running ``main`` (``"module:function"``)."""

    def __init__(
        self, main: str, *, codec: Codec, quiet: bool = True, env: dict[str, str] | None = None
    ) -> None:
        """``quiet``: the worker's stderr goes to /dev/null (else it shares the caller's);
        ``env``: variables added to the worker's environment."""
        module, _, function = main.partition(":")
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.codec = codec
        # Blocked in this thread while it forks: the child inherits the mask across exec and
        # unblocks only after ignoring them (_PRELUDE). Other threads still take the signal.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _CALLER_STOPS)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"{_PRELUDE}from {module} import {function}; {function}()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL if quiet else None,
                env=env,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, obj: Any) -> None:
        """Write one message; WorkerDied if the worker is gone."""
        data = _encode(obj, self.codec)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(_FRAME.pack(len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise WorkerDied(f"cannot write to the worker: {exc}") from exc

    def _fill(self, n: int, deadline: float) -> bool:
        """Read until the buffer holds ``n`` bytes; False if the deadline came first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return False
            chunk = os.read(fd, max(1 << 16, n - len(self._buf)))
            if not chunk:
                raise WorkerDied("the worker closed its output")
            self._buf += chunk
        return True

    def receive(self, deadline: float) -> Any:
        """The next message, or :data:`TIMED_OUT` at ``deadline`` (``time.monotonic``); a
        message cut by the deadline stays buffered for the next call."""
        if not self._fill(_FRAME.size, deadline):
            return TIMED_OUT
        (size,) = _FRAME.unpack_from(self._buf)
        end = _FRAME.size + size
        if not self._fill(end, deadline):
            return TIMED_OUT
        data, self._buf = self._buf[_FRAME.size : end], self._buf[end:]
        return _decode(data, self.codec)

    def call(self, obj: Any, timeout: float) -> Any:
        """Send ``obj`` and wait at most ``timeout`` s for the reply (TIMED_OUT if none)."""
        self.send(obj)
        return self.receive(time.monotonic() + timeout)

    def wait_ready(self, timeout: float, what: str) -> Any:
        """The worker's first message (its "ready"); RuntimeError naming ``what`` if it does
        not come within ``timeout`` s."""
        try:
            ready = self.receive(time.monotonic() + timeout)
        except (WorkerDied, ValueError, pickle.UnpicklingError):
            ready = TIMED_OUT
        if ready is TIMED_OUT:
            self.kill()
            raise RuntimeError(f"the {what} did not start ({self.exit_description()})")
        return ready

    def exit_description(self) -> str:
        """How the process ended: ``exit code 3``, ``killed by SIGKILL``, or ``still running``."""
        code = self.proc.poll()
        if code is None:
            try:
                code = self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


# ----------------------------------------------------------------------------- the worker's side


def limit_memory(megabytes: int) -> None:
    """Cap this process's address space (soft limit): an allocation past it raises
    MemoryError here instead of pushing the machine into swap or the OOM killer. Children
    (a server an env starts) may set their own limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = megabytes << 20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _ignore(signum: int, frame: Any) -> None:
    return None


def _caller_gone() -> None:
    """The protocol pipe broke: the caller died (``kill -9``) or closed it, and nobody reads
    a reply any more. Exit quietly; there is nothing to report and nobody to report it to."""
    os._exit(0)


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="entrogym-worker-parent-watch", daemon=True).start()


def serve(
    handle: Callable[[Any], Any],
    *,
    codec: Codec,
    memory_mb: int | None = None,
    warm_up: Callable[[], Any] | None = None,
    unsendable: Callable[[Any, BaseException], Any] | None = None,
) -> None:
    """The worker's loop: read a message, write ``handle(message)``'s reply, until stdin ends.

    ``warm_up`` runs before the worker says it is ready (so its cost never counts against a
    caller's deadline) and its result is the "ready" message. ``unsendable(reply, error)`` is
    the reply sent instead of one that cannot be encoded (default: the worker exits).
    """
    if memory_mb is not None:
        limit_memory(memory_mb)
    # The start-up ignored SIGINT and SIGTERM (module docstring). From here a no-op handler
    # does the same, while programs the worker starts get the default actions back (SIG_IGN
    # would be inherited across their exec); a handler that returns makes interrupted system
    # calls resume (PEP 475), and the buffered writer below finishes an interrupted write.
    for sig in _CALLER_STOPS:
        signal.signal(sig, _ignore)
    # Libraries print; keep the protocol channel private and send their output to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    source = sys.stdin.buffer
    _exit_with_parent()

    def write(data: bytes) -> None:
        try:
            out.write(_FRAME.pack(len(data)))
            out.write(data)
            out.flush()
        except BrokenPipeError:
            _caller_gone()

    def encode(reply: Any) -> bytes:
        try:
            return _encode(reply, codec)
        except Exception as exc:  # noqa: BLE001 - an unencodable reply, MemoryError
            if unsendable is None:
                raise
            return _encode(unsendable(reply, exc), codec)

    write(_encode({"ready": True} if warm_up is None else warm_up(), codec))
    while True:
        header = source.read(_FRAME.size)
        if len(header) < _FRAME.size:
            return
        (size,) = _FRAME.unpack(header)
        message = source.read(size)
        if len(message) < size:  # the caller died while sending
            return
        write(encode(handle(_decode(message, codec))))
