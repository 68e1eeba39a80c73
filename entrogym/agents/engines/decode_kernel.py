"""The static decoder's C++ kernels on CPU (``decode_attention.cpp``, ``decode_linear.cpp``,
``decode_ops.cpp``), built once per machine at first use.

One decode step's attention is, per (row, kv head), a few tiny matmuls: at SmolLM2's shapes
(24 rows, 3 query rows per kv head, 64-wide heads, ~100 keys) torch's kernels spend most of
their time outside the arithmetic. The C++ kernel does the whole step's attention in one call,
in fp32 from fp32 or bf16 caches, with the keys cached transposed; the decoder takes it on CPU
wherever it builds and the shape is one it was compiled for (:data:`SHAPES`), and its own
torch attention otherwise. With it come one-call versions of the rest of a step's small ops:
the attention with its rotary embedding and cache writes (:func:`attention_step`), RMSNorm
(:func:`rms_norm`), the MLP's ``silu(gate) * up`` (:func:`silu_mul`) and the inverse-CDF token
draw with its log-prob (:func:`cdf_sample`), and an fp32 projection kernel that streams each
weight once per step (:func:`linear`, on CPUs with AVX-512). Each computes the formula of the
torch code it replaces (named in its docstring), which the tests hold it to.

Building needs a C++ compiler and ``ninja`` (``torch.utils.cpp_extension``). The build lives in
``$ENTROGYM_CACHE/kernels/`` under a name keyed by the sources (and their folder), torch's
version and this CPU's instruction sets (it is compiled with ``-march=native``), so a machine
builds it once, in about a minute, and a changed source or CPU builds anew.
``ENTROGYM_DECODE_KERNEL=0`` turns it off.
A build that fails is logged once and the decoder keeps torch's attention: the samples' math is
the same, only slower. The built ``.so`` is recorded with its size and sha256
(``entrogym_kernel.json``) and verified before it is loaded: a damaged one (cut short by a full
disk or a killed build, emptied, overwritten) is rebuilt once, in one line that says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from entrogym.atomic import atomic_write_text
from entrogym.models import default_cache_dir

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("decode_kernels.h", "decode_attention.cpp", "decode_linear.cpp", "decode_ops.cpp")
)
FLAGS = ["-O3", "-march=native", "-fopenmp"]
# (query rows per kv head, head dim) the attention is compiled for: EG_SHAPES in its source
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


def plan(
    device: torch.device,
    dtype: torch.dtype,
    per_group: int,
    head_dim: int,
    *,
    packed: bool | None = None,
    kernels: bool | None = None,
) -> dict[str, bool]:
    """The static decoder's choice of kernels for a model of this shape on ``device`` in
    ``dtype`` (``packed``/``kernels`` None: wherever they run): ``packed`` (projections
    packed for oneDNN, :func:`entrogym.onednn.supported`), ``kernels`` (one-token steps on
    these C++ kernels, :func:`supports`) and ``stream`` (fp32 projections on
    :func:`linear`, which needs both and AVX-512)."""
    from entrogym import onednn

    packed = onednn.supported(device, dtype) if packed is None else packed
    kernels = supports(device, dtype, per_group, head_dim) if kernels is None else kernels
    stream = packed and kernels and dtype == torch.float32 and linear_supported()
    return {"packed": packed, "kernels": kernels, "stream": stream}


def plan_names(choice: dict[str, bool]) -> dict[str, str]:
    """:func:`plan`'s choice in words: what runs a decode step's projections and the rest of
    its ops (norms, rotary embedding, attention, token draw)."""
    if choice["stream"]:
        projections = "entrogym decode_linear (fp32, AVX-512 weight streaming)"
    elif choice["packed"]:
        projections = "oneDNN linear (weights packed once)"
    else:
        projections = "torch matmul (input-major weights)"
    step = "entrogym C++ step kernels" if choice["kernels"] else "torch ops"
    return {"projections": projections, "step_ops": step}


def attention(
    q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, end: int
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d), masked) v`` of one decode step: ``q`` [B, G, R, d] (each kv
    head's query group as R rows), ``keys_t`` [B, G, d, C] (the cache's keys, transposed),
    ``values`` [B, G, C, d], ``valid`` [B, C] (True: the key is attended), over the first
    ``end`` columns. [B, G, R, d] in q's dtype."""
    return _built().decode_attention(q.contiguous(), keys_t, values, valid, end)


def attention_step(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys_t: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    column: int,
) -> torch.Tensor:
    """One decode step's attention with its prologue, as ``StaticDecoder._forward`` computes it
    for one token per row: the queries and keys of ``qkv`` [B, (H + 2G) d] (the fused q|k|v
    projection's output) rotated by ``cos``/``sin`` [B, d] (``static_decode.rotate``, rounded as
    its three ops round), the key and value written into ``keys_t`` [B, G, d, C] and ``values``
    [B, G, C, d] at ``column``, then :func:`attention` over the first ``column + 1`` columns
    (``valid`` [B, C]). Returns [B, H d] in qkv's dtype."""
    kernel = _built()
    return kernel.decode_attention_step(qkv, cos, sin, keys_t, values, valid, column)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm(x, weight.shape, weight, eps)`` of ``x`` [N, H] (Llama's RMSNorm), in fp32
    from fp32 or bf16 and rounded once to x's dtype."""
    return _built().decode_rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``gate_up`` [N, 2I] = gate | up, each op's result rounded to
    its dtype as torch's two ops round."""
    return _built().decode_silu_mul(gate_up)


def cdf_sample(
    scores: torch.Tensor, logits: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``scores`` [B, V] (fp32; the processed logits), drawn as
    ``draws.inverse_cdf_draw(F.softmax(scores, -1))`` draws it for the same uniforms
    (``uniforms`` [B] float64 in [0, 1): what that draw takes from torch's generator), with
    ``log_softmax(logits)`` at it; ``logits`` [B, V] are the raw logits (``scores`` itself when
    nothing processes them). Two passes over a row's logits, where softmax, the draw's float64
    block sums and log-softmax took four. Returns ids [B] (int64) and log-probs [B] (fp32)."""
    return _built().decode_cdf_sample(scores, logits, uniforms)


def linear_supported() -> bool:
    """Whether :func:`linear` runs here: the kernels built, for a CPU with AVX-512 (its 24 row
    accumulators need 32 vector registers; elsewhere the decoder keeps oneDNN's kernel)."""
    kernel = module() if enabled() else None
    return kernel is not None and bool(kernel.decode_linear_supported())


def linear_pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] (fp32) packed for :func:`linear`: [ceil(N / 16), K, 16], each block of
    16 output columns one sequential stream."""
    return _built().decode_linear_pack(weight)


def linear_pack_into(
    packed: torch.Tensor,
    row: int,
    weight: torch.Tensor,
    lora_b: torch.Tensor | None = None,
    lora_a: torch.Tensor | None = None,
    scaling: float = 1.0,
) -> None:
    """Rows ``row:row + N`` (whole blocks of 16) of ``packed`` [blocks, K, 16] filled with
    ``weight`` [N, K] (fp32) plus ``scaling * lora_b @ lora_a`` (a LoRA adapter merged in, as
    peft merges it; none without the factors), in :func:`linear_pack`'s layout, in one pass: a
    stacked projection (q|k|v) merges and packs each of its modules at its own rows."""
    _built().decode_linear_pack_into(packed, row, weight, lora_b, lora_a, scaling)


def linear(
    x: torch.Tensor, packed: torch.Tensor, n: int, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T`` (plus ``residual`` [M, n]) for ``x`` [M, K] fp32 and ``packed`` =
    :func:`linear_pack` of ``weight`` [n, K]: ``F.linear``'s formula, summed over K in order,
    with every weight read from memory once however many rows."""
    return _built().decode_linear(x, packed, n, residual)


def _built() -> Any:
    kernel = module()
    if kernel is None:
        raise RuntimeError("the decode kernels are not built (see the log)")
    return kernel


def build_key() -> str:
    """What the build depends on: the sources and where they are (ninja's build file names
    them by path: two installs sharing one folder would rebuild it for each other), torch's
    version, the flags and this CPU's instruction sets (``-march=native``)."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
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
    """The built kernel's module, built now if needed (once per process); None, logged in one
    line, where it cannot be built. A built ``.so`` is loaded only once its size and sha256
    match the record written when it was built (:func:`_problem`); a damaged one is rebuilt
    once (a truncated one would crash the process with SIGBUS as it loads)."""
    if platform.system() != "Linux":
        return None
    key = build_key()
    folder = default_cache_dir() / "kernels" / f"decode_kernels-{key}"
    damaged = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _build_lock(folder):
            so = folder / f"{NAME_PREFIX}{key}.so"
            damaged = _problem(so)
            if damaged is None:
                return _import(so)
            if damaged != UNRECORDED:
                why = f"the decode kernels in {folder} are damaged ({damaged})"
                _compiler(f"{why} and cannot be rebuilt")
                log.warning("entrogym: %s; rebuilding them once", why)
            so.unlink(missing_ok=True)  # ninja builds what is missing
            return _build(folder, key)
    except KernelUnavailable as exc:
        log.warning("entrogym: %s; %s", exc, FALLBACK)
    except Exception as exc:  # a missing ninja or header, a failed build: torch's ops instead
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        log.warning("entrogym: the decode kernels could not be built (%s); %s",
                    reason[:300], FALLBACK)  # fmt: skip
    return None


NAME_PREFIX = "entrogym_decode_kernels_"
RECORD = "entrogym_kernel.json"  # the built .so's name, size and sha256
UNRECORDED = "not built, or built without a record"
FALLBACK = "the static decoder uses torch's ops (same samples' math, slower)"
WAIT_BEFORE_SAYING_S = 1.0  # a lock held longer than a load takes is another process's build


class KernelUnavailable(RuntimeError):
    """The kernels cannot be built here; the message says why, in the user's terms."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _problem(so: Path) -> str | None:
    """Why ``so`` may not be loaded (None: it matches its record): missing, unrecorded, or
    another size or sha256 than when it was built."""
    try:
        record = json.loads((so.parent / RECORD).read_text(encoding="utf-8"))
        size, digest = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return UNRECORDED
    if record.get("file") != so.name or not so.is_file():
        return UNRECORDED if not so.exists() else f"{so.name} is not the file on record"
    actual = so.stat().st_size
    if actual != size:
        return f"{so.name} has {actual} bytes, {size} when it was built"
    if _sha256(so) != digest:
        return f"{so.name} does not match its sha256 from when it was built"
    return None


def _record(so: Path) -> None:
    """Write the size and sha256 of a freshly built ``so`` beside it."""
    record = {"file": so.name, "size": so.stat().st_size, "sha256": _sha256(so)}
    atomic_write_text(so.parent / RECORD, json.dumps(record, indent=2) + "\n")


def _compiler(context: str = "the decode kernels could not be built") -> str:
    """The C++ compiler torch's build would run (``CXX``, else ``c++``), or
    :class:`KernelUnavailable` saying none was found, after ``context``."""
    cxx = os.environ.get("CXX", "c++")
    words = shlex.split(cxx) or ["c++"]
    if shutil.which(words[0]) is None:
        raise KernelUnavailable(
            f"{context}: no C++ compiler found ({words[0]!r}; install g++ or set CXX)"
        )
    return cxx


def _import(so: Path) -> Any:
    """The verified extension module at ``so``, imported as torch's loader imports it."""
    spec = importlib.util.spec_from_file_location(so.stem, so)
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    return kernel


@contextlib.contextmanager
def _build_lock(folder: Path):
    """One builder per machine at a time: an flock, which the system releases when its process
    dies. A process that finds it held longer than a load takes says whom it waits for. torch's
    own lock file in the folder is then one a killed build left (torch would wait for it
    forever), so it is removed."""
    with open(folder / "entrogym.lock", "a+") as handle:
        deadline = time.monotonic() + WAIT_BEFORE_SAYING_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                log.warning("entrogym: waiting for %s, which is building the decode kernels in %s",
                            f"process {holder}" if holder.isdigit() else holder, folder)  # fmt: skip
                fcntl.flock(handle, fcntl.LOCK_EX)
                break
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        (folder / "lock").unlink(missing_ok=True)
        yield


def _build(folder: Path, key: str) -> Any:
    """Build the kernels in ``folder`` (torch's ``cpp_extension``: ninja rebuilds what is
    missing or stale), record the ``.so`` and return its module."""
    _compiler()
    from torch.utils.cpp_extension import load

    name = f"{NAME_PREFIX}{key}"
    fresh = not any(folder.glob("*.o"))
    if fresh:  # a warning, so that the minute's pause is explained where nothing logs INFO
        log.warning(
            "entrogym: building the decode kernels once per machine in %s (about a minute)",
            folder,
        )
    start = time.perf_counter()
    kernel = load(
        name=name,
        sources=[str(s) for s in SOURCES if s.suffix == ".cpp"],
        extra_cflags=FLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )
    _record(folder / f"{name}.so")
    if fresh:
        log.info("entrogym: decode kernels built in %.0f s", time.perf_counter() - start)
    return kernel
