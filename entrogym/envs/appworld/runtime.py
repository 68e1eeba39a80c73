"""The managed AppWorld runtime: its virtualenv, its data root and its environment server.

``appworld`` needs pydantic<2 and vLLM needs pydantic>=2, so appworld lives in its own
virtualenv (``.venv-appworld`` at the repository root, made by ``entrogym appworld setup``)
and is reached over HTTP. ``appworld serve environment`` binds 0.0.0.0 and runs model-written
code, so we start uvicorn on ``appworld.serve.environment:app`` ourselves: bound to
127.0.0.1 only, in its own process group, with an address-space limit (RLIMIT_AS) so a
runaway allocation ends in a MemoryError inside the server instead of taking the machine, and
behind a watchdog that ends it when the process owning it dies, even by SIGKILL
(:class:`entrogym.localserver.OwnedPopen`).
AppWorld's server holds one world at a time, so each concurrent episode gets its own server.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
from pathlib import Path

from entrogym.localserver import (
    OwnedPopen,
    free_port,
    port_in_use,
    stop_process_group,
    wait_for_http,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
SETUP_HINT = "create it with `entrogym appworld setup` (or `make appworld-setup`)"
DATA_HINT = (
    "get the real data with `entrogym appworld setup --download --root DIR` (needs internet), "
    "or build the offline fixture world with `entrogym appworld fixture DIR`"
)


def default_venv() -> Path:
    """``$ENTROGYM_APPWORLD_VENV`` or ``<repo>/.venv-appworld``."""
    return Path(os.environ.get("ENTROGYM_APPWORLD_VENV", REPO_ROOT / ".venv-appworld"))


def appworld_python(venv: str | Path | None = None) -> Path:
    """The interpreter of the AppWorld virtualenv; a clear error if it is missing."""
    venv = Path(venv) if venv else default_venv()
    python = venv / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"AppWorld virtualenv not found at {venv}: {SETUP_HINT}.")
    return python


def check_root(appworld_root: str | Path | None) -> Path:
    """Validate an AppWorld root (a folder holding ``data/tasks`` and ``data/datasets``)."""
    if appworld_root is None:
        env = os.environ.get("APPWORLD_ROOT")
        if not env:
            raise ValueError(f"appworld_root is not set and APPWORLD_ROOT is empty: {DATA_HINT}.")
        appworld_root = env
    root = Path(appworld_root).expanduser().resolve()
    for sub in ("data/tasks", "data/datasets", "data/base_dbs", "data/api_docs"):
        if not (root / sub).is_dir():
            raise ValueError(
                f"appworld_root={str(root)!r} has no {sub}/ (no AppWorld data): {DATA_HINT}."
            )
    return root


def _limit_memory(max_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))

    return apply


class AppWorldServer:
    """One AppWorld environment server process on 127.0.0.1 (one world at a time)."""

    def __init__(
        self,
        appworld_root: str | Path,
        venv: str | Path | None = None,
        port: int | None = None,
        memory_limit_mb: int = 4096,
        startup_timeout_s: float = 120.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.root = check_root(appworld_root)
        self.python = appworld_python(venv)
        self.requested_port = port
        self.memory_limit_mb = memory_limit_mb
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("AppWorld server is not started")
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        if self.alive():
            return
        if self.requested_port is not None:
            if port_in_use(self.requested_port):
                raise ValueError(
                    f"port={self.requested_port} is already in use on 127.0.0.1: pass another "
                    "port, or port=None to pick a free one."
                )
            self.port = self.requested_port
        else:
            self.port = free_port()
        env = dict(os.environ, APPWORLD_ROOT=str(self.root), PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the main venv's paths must not leak into appworld's
        cmd = [
            str(self.python), "-m", "uvicorn", "appworld.serve.environment:app",
            "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
        ]  # fmt: skip
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            # A session of its own (stop() also ends anything it spawned), guarded by a watchdog
            # that ends it when this process dies, even by SIGKILL (see entrogym.localserver).
            self.process = OwnedPopen(
                cmd,
                cwd=str(self.root),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if self.log_path else subprocess.DEVNULL,
                preexec_fn=_limit_memory(self.memory_limit_mb * 2**20),
            )
        finally:
            if not isinstance(log, int):
                log.close()  # the server holds its own copy of the file
        self._wait_ready()

    def _wait_ready(self) -> None:
        outcome = wait_for_http(
            self.url + "/", alive=self.alive, timeout=self.startup_timeout_s, interval=0.2
        )
        if outcome == "exited":
            code = self.process.returncode if self.process else None
            raise RuntimeError(
                f"AppWorld server exited during startup (code {code}); see "
                f"{self.log_path or 'its log (pass log_path)'}."
            )
        if outcome == "timeout":
            self.stop()
            raise TimeoutError(f"AppWorld server did not answer within {self.startup_timeout_s} s")

    def stop(self) -> None:
        proc, self.process = self.process, None
        stop_process_group(proc, term_wait=5.0)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
