"""Plumbing for the loopback servers entrogym starts (``vllm serve``, AppWorld's environment).

Every server binds 127.0.0.1, runs in a process session of its own (so stopping it also ends
whatever it spawned), and is ready once an HTTP endpoint answers 200.

A server must not outlive the process that started it, even when that process is killed with
SIGKILL and runs no cleanup. ``PR_SET_PDEATHSIG`` does not fit: it fires when the *thread* that
forked exits, and rollouts start servers from worker threads. So :class:`OwnedPopen` starts the
server behind a small watchdog (``_WATCHDOG``): the launcher forks a watchdog and then execs the
server (the owner's ``Popen.pid`` is the server's pid). The watchdog holds the read end of a
pipe whose only write end is in the owner; EOF on it, or the owner's pidfd turning readable,
means the owner is gone, and the watchdog ends the server's process group (SIGTERM, then
SIGKILL after a grace period). The kernel closes the pipe when the owner dies however it dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import requests


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def wait_for_http(
    url: str, *, alive: Callable[[], bool], timeout: float, interval: float = 0.5
) -> Literal["ready", "exited", "timeout"]:
    """Poll ``url`` until it answers 200 (``"ready"``), the process dies (``"exited"``) or
    ``timeout`` seconds pass (``"timeout"``); callers turn the outcome into their own error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return "exited"
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return "ready"
        except requests.RequestException:
            pass
        time.sleep(interval)
    return "timeout"


# argv: -c LIFELINE_FD OWNER_PID GRACE_S CMD... ; stdlib only, so any python can run it.
_WATCHDOG = r"""
import os, select, signal, sys, time
fd, owner, grace, cmd = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
server = os.getpid()
if os.fork():  # the launcher becomes the server, so the owner's Popen watches the server itself
    os.close(fd)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"cannot start {cmd[0]!r}: {exc}\n")
        os._exit(127)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a normal stop ends the server; we follow it
signal.signal(signal.SIGINT, signal.SIG_IGN)
watch = [fd]
try:  # also covers a forked copy of the owner that inherited the pipe's write end
    watch.append(os.pidfd_open(owner))
except (AttributeError, OSError):
    pass
while os.getppid() == server:  # reparented: the server has exited, nothing left to guard
    if select.select(watch, [], [], 1.0)[0]:  # pipe EOF or owner exited
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while os.getppid() == server and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)  # stragglers, then this watchdog itself
"""


class OwnedPopen(subprocess.Popen):
    """``subprocess.Popen`` of ``cmd`` in a session of its own that dies with this process.

    A watchdog in the server's process group ends the group when this process exits or is
    killed (see the module docstring), or when :meth:`release` closes the lifeline. ``pid`` is
    the server's own pid. Takes Popen's keyword arguments (``start_new_session`` is implied).
    """

    def __init__(self, cmd: Sequence[str], *, grace_s: float = 5.0, **kwargs: Any) -> None:
        self._lifeline: int | None = None
        read_fd, write_fd = os.pipe()  # both close-on-exec: no other child inherits the write end
        launcher = [sys.executable, "-I", "-c", _WATCHDOG, str(read_fd), str(os.getpid())]
        try:
            super().__init__(
                [*launcher, str(grace_s), *map(str, cmd)],
                pass_fds=(read_fd,),
                start_new_session=True,
                **kwargs,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        self._lifeline = write_fd

    def release(self) -> None:
        """Close the lifeline: the watchdog then ends whatever is left of the process group."""
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            os.close(fd)

    def __del__(self, *args: Any, **kwargs: Any) -> None:
        # a dropped handle must not keep the server alive for the rest of the owner's life
        self.release()
        super().__del__(*args, **kwargs)


def stop_process_group(proc: subprocess.Popen | None, term_wait: float = 10.0) -> None:
    """SIGTERM the process's session, then SIGKILL what is left after ``term_wait`` seconds;
    an :class:`OwnedPopen`'s lifeline is closed afterwards (its watchdog then exits too)."""
    if proc is None:
        return
    try:
        _stop(proc, term_wait)
    finally:
        if isinstance(proc, OwnedPopen):
            proc.release()


def _stop(proc: subprocess.Popen, term_wait: float) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
