"""The generation roofline: what one decode step of a batch costs in FLOPs and in bytes read,
this machine's matmul rate and read bandwidth, and the tokens/s bounds they give. Used by
``decode_throughput.py`` and ``iteration.py`` (``generation_roofline_fraction``). Imports torch
and ``entrogym.onednn`` (torch and ``entrogym.dtypes``), so both the entrogym venv and
``.venv-bench``, which installs entrogym without extras, can use it.

Per decode step of B rows (P matmul weights in the body and the LM head, L layers, query width
Q, KV width W, C keys attended per row)::

    flops = 2 * B * P + 4 * B * L * Q * C                  (weight matmuls; QK^T and AV)
    bytes = P * itemsize + 2 * B * L * W * C * itemsize    (the weights; the KV cache)
    flop_bound = B / (flops / matmul_rate)      byte_bound = B / (bytes / read_rate)
    generation_roofline_fraction = tokens_per_s / min(flop_bound, byte_bound)

Prefill, the norms and the sampling are in a measured time but not in the bound, so the
fraction is a lower bound on how much of the machine the decode loop uses. torch is imported
only where a rate is measured: the report computes bounds and fractions without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DecodeShape:
    """What a decode step's cost depends on, read from a Llama-style config (Llama, SmolLM2,
    Qwen2/3, Mistral: q/k/v/o projections, a gated MLP, an LM head)."""

    weights: int  # every linear layer's weight: q, k, v, o, gate, up, down per layer; the head
    layers: int
    q_width: int  # attention heads x head dim
    kv_width: int  # KV heads x head dim
    hidden: int
    intermediate: int

    @classmethod
    def from_config(cls, config: Any) -> DecodeShape:
        """The shape of a ``transformers`` config. The input embedding is a lookup, not a
        matmul; a tied one is read once, as the LM head."""
        try:
            hidden, inter = config.hidden_size, config.intermediate_size
            heads, layers = config.num_attention_heads, config.num_hidden_layers
            kv_heads = getattr(config, "num_key_value_heads", None) or heads
            head_dim = getattr(config, "head_dim", None) or hidden // heads
            vocab = config.vocab_size
        except AttributeError as exc:
            raise ValueError(f"the roofline needs a Llama-style model config ({exc})") from None
        q, kv = heads * head_dim, kv_heads * head_dim
        per_layer = hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * inter
        return cls(layers * per_layer + vocab * hidden, layers, q, kv, hidden, inter)


def decode_step_flops(shape: DecodeShape, batch: int, context: float) -> float:
    """Matmul FLOPs of one decode step (module docstring): 2 per weight per row, and QK^T and
    AV over ``context`` keys in every layer (each query head against its KV head's keys)."""
    return 2 * batch * shape.weights + 4 * batch * shape.layers * shape.q_width * context


def decode_step_bytes(shape: DecodeShape, batch: int, context: float, itemsize: int) -> float:
    """Bytes one decode step must read (module docstring): every weight once for the batch,
    and each row's keys and values in every layer."""
    return (shape.weights + 2 * batch * shape.layers * shape.kv_width * context) * itemsize


def best_seconds(fn: Callable[[], object], reps: int) -> float:
    """Fastest of ``reps`` timed calls after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def onednn_kernel(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object] | None:
    """``a @ b`` by oneDNN's linear kernel over ``b`` packed once (``entrogym.onednn``, what the
    ``hf`` engine's static decoder runs on CPU); None where ``entrogym.onednn.supported`` says
    it does not run. MKL's sgemm, which ``a @ b`` calls on CPU, can be far from what the
    machine does: 121 against 394 GFLOP/s in fp32 at [24, 576] x [576, 1536] on an AMD EPYC
    (docs/results.md), so a ceiling is the best of both."""
    from entrogym import onednn

    if not onednn.supported(a.device, a.dtype):
        return None
    packed = onednn.pack(b.t())
    return lambda: onednn.linear(a, packed)


def decoder_kernel(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object] | None:
    """``a @ b`` by the ``hf`` engine's own fp32 streaming kernel over ``b`` packed once
    (``decode_kernel.linear``, what the static decoder runs on a CPU with AVX-512); None where it
    does not run (another dtype or CPU, or a venv that cannot build it)."""
    import torch

    if a.dtype != torch.float32:
        return None
    try:
        from entrogym.agents.engines import decode_kernel
    except ImportError:
        return None
    if not decode_kernel.linear_supported():
        return None
    packed = decode_kernel.linear_pack(b.t().contiguous())
    return lambda: decode_kernel.linear(a, packed, b.shape[1])


def matmul_rate(dtype: torch.dtype, rows: int, hidden: int, inner: int) -> float:
    """FLOP/s of [rows, hidden] x [hidden, inner] in ``dtype`` (the decode step's MLP shape),
    best of 20 timings of 50 products, by the fastest kernel (torch's matmul, oneDNN's over a
    packed weight: :func:`onednn_kernel`, or the decoder's own: :func:`decoder_kernel`), at
    this process's threads and at one thread,
    whichever is faster: where other jobs hold the cores, the threads' synchronisation can
    make a small matmul many times slower on 2 threads than on 1, and a ceiling is the best
    the machine gives (measured here: 0.2 against 88 GFLOP/s at a load average of 11 on 2
    cores)."""
    import torch

    a, b = torch.randn(rows, hidden).to(dtype), torch.randn(hidden, inner).to(dtype)
    kernels = [lambda: a @ b, onednn_kernel(a, b), decoder_kernel(a, b)]
    threads = torch.get_num_threads()
    best = float("inf")
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            for kernel in filter(None, kernels):
                best = min(best, best_seconds(lambda k=kernel: [k() for _ in range(50)], 20))
    finally:
        torch.set_num_threads(threads)
    return 2 * rows * hidden * inner * 50 / best


def read_rate(gib: float = 1.0) -> float:
    """Bytes/s of summing a ``gib`` GiB fp32 tensor, best of 5: memory bandwidth, whatever
    the sampler's dtype (a bf16 sum on CPU converts as it goes, which is compute)."""
    import torch

    big = torch.ones(int(gib * 2**28))
    return big.numel() * 4 / best_seconds(big.sum, 5)


def measure_rates(dtype: torch.dtype, shape: DecodeShape, batch: int) -> dict[str, float]:
    """This machine's ceilings for a decode step of ``batch`` rows in ``dtype``, in the units
    :func:`bounds` takes."""
    rate = matmul_rate(dtype, batch, shape.hidden, shape.intermediate)
    return {"matmul_gflops": round(rate / 1e9, 1), "read_gb_s": round(read_rate() / 1e9, 1)}


def bounds(
    shape: DecodeShape,
    batch: int,
    context: float,
    itemsize: int,
    rates: dict[str, float],
) -> dict[str, Any]:
    """The tokens/s bounds of the module docstring, with every input beside them."""
    flops = decode_step_flops(shape, batch, context)
    nbytes = decode_step_bytes(shape, batch, context, itemsize)
    flop_bound = batch * rates["matmul_gflops"] * 1e9 / flops
    byte_bound = batch * rates["read_gb_s"] * 1e9 / nbytes
    return {
        **rates,
        "batch": batch,
        "context": round(context, 1),
        "itemsize": itemsize,
        "shape": asdict(shape),
        "flops_per_step": flops,
        "bytes_per_step": nbytes,
        "flop_bound_tokens_per_s": round(flop_bound, 1),
        "byte_bound_tokens_per_s": round(byte_bound, 1),
    }


def roofline_fraction(tokens_per_s: float, bound: dict[str, Any]) -> float:
    """``generation_roofline_fraction``: tokens/s over the lower of the two bounds."""
    ceiling = min(bound["flop_bound_tokens_per_s"], bound["byte_bound_tokens_per_s"])
    return round(tokens_per_s / ceiling, 3)


def timed_generation(engine: Any, prompts: list[Any], params: Any, adapter: Any) -> dict[str, Any]:
    """One timed ``engine.generate`` of the whole batch: tokens/s, seconds, tokens and the
    1-minute load average at its end (what each repetition of a generation row records)."""
    import os

    t0 = time.perf_counter()
    out = engine.generate(prompts, params, adapter=adapter)
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for c in out)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "load_1min": round(os.getloadavg()[0], 2),
    }
