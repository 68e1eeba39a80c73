"""Plumbing for the loopback servers entrogym starts (``vllm serve``, AppWorld's environment).

Every server binds 127.0.0.1, runs in a process session of its own (so stopping it also ends
whatever it spawned), and is ready once an HTTP endpoint answers 200.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Literal

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


def stop_process_group(proc: subprocess.Popen | None, term_wait: float = 10.0) -> None:
    """SIGTERM the process's session, then SIGKILL what is left after ``term_wait`` seconds."""
    if proc is None or proc.poll() is not None:
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
