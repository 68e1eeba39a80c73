"""The formulas of the static decoder's forward and sampling, in torch's ops: the attention of
one decode step, RMSNorm, the rotary embedding, and ``generate``'s sampling processors. The C++
kernels (:mod:`decode_kernel`) are held to these by the tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from entrogym.agents.engines.base import SamplingParams


def step_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """One decode step's attention, ``softmax(q k^T / sqrt(d), masked) v`` (Vaswani et al.,
    *Attention Is All You Need*, 2017, eq. 1), as two matmuls and a softmax. ``q`` [B, G, R, d]
    (each kv head's query group as R rows), ``keys``/``values`` [B, G, T, d], ``mask``
    [B, 1, 1, T] (True: the key is seen; every row sees at least one).

    At a decode step's shapes on CPU (24 rows, 3 query rows per kv head, 64-wide heads, 80-120
    keys, 2 threads, fp32) it ran in 111-161 us against 237-248 for
    ``scaled_dot_product_attention``, whose CPU kernel is built for long query blocks
    (docs/results.md). It rounds like any fp32 attention; in bf16 it would round the scores to
    bf16 before the softmax, which that kernel does not, so the decoder uses it in fp32 only."""
    scores = torch.matmul(q, keys.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), values)


def sdpa_step(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """:func:`step_attention` by ``scaled_dot_product_attention`` (bf16, GPUs)."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """Llama's RMSNorm (Zhang and Sennrich, *Root Mean Square Layer Normalization*, 2019,
    eq. 4) with ``norm``'s weight and epsilon, as one fused op (``F.rms_norm``) instead of the
    module's six: 12 us against 17 at a decode step's 24 rows on CPU."""
    return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al., *RoFormer*, 2021, eq. 34) in Llama's rotate-half
    form, ``x cos + [-x2, x1] sin`` over the last dim of ``x`` [B, T, heads, d]; ``cos`` and
    ``sin`` [B, T, d]. A step rotates its queries and keys together, in one call."""
    x1, x2 = x.chunk(2, -1)
    return x * cos[:, :, None] + torch.cat((-x2, x1), -1) * sin[:, :, None]


def sampling_warpers(params: SamplingParams) -> Any:
    """``generate``'s sampling processors for ``params``, in its order (temperature, top-k,
    top-p), left out where they change nothing, as ``generate`` leaves them out."""
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = LogitsProcessorList()
    if params.temperature > 0:
        if params.temperature != 1.0:
            chain.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k != 0:
            chain.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            chain.append(TopPLogitsWarper(top_p=params.top_p))
    return lambda logits: chain(None, logits) if chain else logits
