"""The static decoder's fused attention kernel on CPU (``decode_attention.cpp``), built once per
machine at first use.

One decode step's attention is, per (row, kv head), a few tiny matmuls: at SmolLM2's shapes
(24 rows, 3 query rows per kv head, 64-wide heads, ~100 keys) torch's kernels spend most of
their time outside the arithmetic. The C++ kernel does the whole step's attention in one call,
in fp32 from fp32 or bf16 caches, with the keys cached transposed; the decoder takes it on CPU
wherever it builds and the shape is one it was compiled for (:data:`SHAPES`), and its own
torch attention otherwise.

Building needs a C++ compiler and ``ninja`` (``torch.utils.cpp_extension``). The build lives in
``$ENTROGYM_CACHE/kernels/`` under a name keyed by the source, torch's version and this CPU's
instruction sets (it is compiled with ``-march=native``), so a machine builds it once, in about
a minute, and a changed source or CPU builds anew. ``ENTROGYM_DECODE_KERNEL=0`` turns it off.
A build that fails is logged once and the decoder keeps torch's attention: the samples' math is
the same, only slower.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from entrogym.models import default_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp"]
# (query rows per kv head, head dim) the kernel is compiled for: the EG_CASE list of the source
SHAPES = frozenset(
    [(r, 64) for r in range(1, 9)] + [(1, 32), (2, 32), (4, 32)]
    + [(r, 128) for r in (1, 2, 3, 4, 8)]
)  # fmt: skip
DTYPES = (torch.float32, torch.bfloat16)


def enabled() -> bool:
    """Whether the kernel may be used (``ENTROGYM_DECODE_KERNEL`` is not ``0``)."""
    return os.environ.get("ENTROGYM_DECODE_KERNEL", "1") != "0"


def supports(device: torch.device, dtype: torch.dtype, per_group: int, head_dim: int) -> bool:
    """Whether the kernel computes a step of this shape: a CPU, fp32 or bf16, a compiled shape,
    the kernel enabled and built (building it now if it was not)."""
    if device.type != "cpu" or dtype not in DTYPES or (per_group, head_dim) not in SHAPES:
        return False
    return enabled() and module() is not None


def attention(
    q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, end: int
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d), masked) v`` of one decode step: ``q`` [B, G, R, d] (each kv
    head's query group as R rows), ``keys_t`` [B, G, d, C] (the cache's keys, transposed),
    ``values`` [B, G, C, d], ``valid`` [B, C] (True: the key is attended), over the first
    ``end`` columns. [B, G, R, d] in q's dtype."""
    kernel = module()
    if kernel is None:
        raise RuntimeError("the decode-attention kernel is not built (see the log)")
    return kernel.decode_attention(q.contiguous(), keys_t, values, valid, end)


def build_key() -> str:
    """What the build depends on: the source, torch's version, the flags and this CPU's
    instruction sets (``-march=native``)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{' '.join(FLAGS)}|{platform.machine()}".encode())
    digest.update(_cpu_flags().encode())
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return ""


@functools.cache
def module() -> Any | None:
    """The built kernel's module, built now if needed (once per process); None, logged once,
    where it cannot be built."""
    if platform.system() != "Linux":
        return None
    key = build_key()
    folder = default_cache_dir() / "kernels" / f"decode_attention-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder):
            return _load(folder, key)
    except Exception as exc:  # a missing compiler, ninja or header: torch's attention instead
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        log.warning(
            "entrogym: the decode-attention kernel could not be built (%s); the static decoder "
            "uses torch's attention (same samples' math, slower)",
            reason[:300],
        )
        return None


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One builder per machine at a time: an flock, which the system releases when its process
    dies. torch's own lock file in the folder is then one a killed build left (torch would wait
    for it forever), so it is removed."""
    with open(folder / "entrogym.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        yield


def _load(folder: Path, key: str) -> Any:
    from torch.utils.cpp_extension import load

    name = f"entrogym_decode_attention_{key}"
    fresh = not any(folder.glob(f"{name}*.so"))
    if fresh:  # a warning, so that the minute's pause is explained where nothing logs INFO
        log.warning(
            "entrogym: building the decode-attention kernel once per machine in %s (about a "
            "minute)",
            folder,
        )
    start = time.perf_counter()
    kernel = load(
        name=name,
        sources=[str(SOURCE)],
        extra_cflags=FLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )
    if fresh:
        log.info("entrogym: decode-attention kernel built in %.0f s", time.perf_counter() - start)
    return kernel
