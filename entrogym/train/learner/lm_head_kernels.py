"""LM-head kernels: exact fp32 log-probs of sampled tokens and exact entropies, without the
full logits (split from :mod:`entrogym.train.learner.logprobs`, which scores whole sequences).

The importance ratio of every algorithm is exp(logp_new - logp_old); the paper (Sec. 4,
appendix "Numerical considerations", Thm 3) shows that computing these log-probs in bf16
biases the ratio. Here the final hidden states and the LM-head weight both enter the product
in fp32, so the log-probs are fp32 even when the model computes in bf16/fp16, and the
``[tokens, vocab]`` logits are never held at once:

* ``impl="chunked"``: a custom autograd Function that walks the tokens in chunks and recomputes
  each chunk's logits in backward (default on CPU);
* ``impl="cce"``: Apple's Cut Cross-Entropy forward kernel, with the exact chunked backward
  (default on CUDA: CCE's own backward takes only 16-bit inputs);
* ``impl="torch_compile"``: Cut Cross-Entropy's ``torch.compile`` path, which runs anywhere but
  materialises the logits inside its compiled graph (kept for comparison; see the benchmark).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch
from torch import Tensor

from entrogym import onednn
from entrogym.dtypes import bf16_round

# p_target > 1 - 2^-23  <=>  logp_target > log1p(-2^-23): in fp32, 1 - p rounds to 0 there (the
# paper's threshold). The fix no longer branches on it (it applies to every row); kept as the
# named regime for tests and diagnostics.
SOFTMAX_FIX_LOGP_THRESHOLD = math.log1p(-(2.0**-23))
# CCE's logp is lse - z rounded at the scale of the logits, so a near-1 probability can come
# out a few ulps of |z| away from 0; recompute all rows this confident exactly.
_CCE_RECOMPUTE_LOGP = -1e-4
# Elements of one chunk's [tokens, vocab] fp32 block (64 MiB): large enough for efficient
# matmuls, small beside the full logits of a long batch.
DEFAULT_CHUNK_ELEMENTS = 1 << 24
IMPLS = ("auto", "chunked", "cce", "torch_compile")


def _chunk_rows(vocab: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
        return chunk_size
    return max(1, DEFAULT_CHUNK_ELEMENTS // vocab)


def _check_targets(targets: Tensor, vocab: int) -> None:
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"token ids must lie in [0, {vocab}) (the LM head's vocabulary), got ids in "
            f"[{int(targets.min())}, {int(targets.max())}]; were the tokens produced by a "
            "different tokenizer or model?"
        )


def target_gradient_coefficient(logp: Tensor, p_target: Tensor, softmax_fix: bool) -> Tensor:
    """d logp_target / d z_target = 1 - p_target (appendix "Softmax Gradient Numerical Precision").

    The backward recomputes p_target = exp(z_t - lse) from an fp32 lse, so 1 - p_target carries
    an absolute error of about an ulp of the logits (~1e-6 at |z| ~ 20): it rounds to 0 once
    p > 1 - 2^-23, as the paper says, but is already off by >10% for 1 - p below ~1e-5. With
    ``softmax_fix`` every position gets 1 - p recomputed in fp64 as -expm1(logp) from the
    accurately computed fp32 log-prob (relative error ~1e-7 at any p), O(1) per position; the
    other tokens' -p_j keep their fp32 values, whose relative error is already small.
    """
    if not softmax_fix:
        return 1.0 - p_target
    return (-torch.expm1(logp.double())).to(p_target.dtype)


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """``hidden @ weight.T``: one chunk's logits [rows, V], by oneDNN's kernel on CPU
    (:mod:`entrogym.onednn`: 2x MKL's sgemm there, docs/results.md). Called inside the
    autograd Functions below, which compute their own gradients."""
    if onednn.supported(hidden.device, hidden.dtype):
        return onednn.linear(hidden, weight)
    return hidden @ weight.T


# The frozen head's transpose, kept between backward calls: (the weight, its version, W^T).
_transposed_head: tuple[weakref.ref, int, Tensor] | None = None


def _head_transposed(weight: Tensor) -> Tensor:
    """``weight.t().contiguous()``, copied once while ``weight`` is frozen and unchanged (a LoRA
    policy's head: SmolLM2's [49152, 576] took 62 ms to transpose, once per micro-batch's
    backward); a weight that trains is copied on every call."""
    global _transposed_head
    if weight.requires_grad:
        return weight.t().contiguous()
    cached = _transposed_head
    if cached is not None and cached[0]() is weight and cached[1] == weight._version:
        return cached[2]
    _transposed_head = None  # the old copy goes before the new one is made
    transposed = weight.t().contiguous()
    _transposed_head = (weakref.ref(weight), weight._version, transposed)
    return transposed


def _times_weight(weight: Tensor):
    """``gz -> gz @ weight`` for the chunks of one backward: by oneDNN on CPU, over the head's
    transpose (:func:`_head_transposed`)."""
    if onednn.supported(weight.device, weight.dtype):
        transposed = _head_transposed(weight)
        return lambda gz: onednn.linear(gz, transposed)
    return lambda gz: gz @ weight


def _chunk_logp(z: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Log-prob of the targets and logsumexp of one chunk of fp32 logits.

    When the target is the arg-max, logp = -log1p(sum of the other exp(z_j - z_t)), which keeps
    tiny values like -1e-9 that z_t - lse would round to 0.
    """
    m = z.amax(-1, keepdim=True)
    zt = z.gather(1, targets[:, None]).squeeze(1)
    e = z.sub_(m).exp_()  # in place: one [rows, V] buffer per chunk
    total = e.sum(-1)
    m = m.squeeze(1)
    return _target_logp(e, zt, m, targets), m + torch.log(total)


def _target_logp(e: Tensor, zt: Tensor, m: Tensor, targets: Tensor) -> Tensor:
    """The targets' log-probs from one chunk's ``e = exp(z - m)`` (``e`` is overwritten), the
    target logits ``zt`` and the row maxima ``m`` (:func:`_chunk_logp`'s formula)."""
    e.scatter_(1, targets[:, None], 0.0)
    others = e.sum(-1)
    general = (zt - m) - torch.log(torch.exp(zt - m) + others)
    return torch.where(zt >= m, -torch.log1p(others), general)


def _logp_logit_grad(p: Tensor, targets: Tensor, grad: Tensor, coef: Tensor) -> Tensor:
    """d(grad . logp_target)/dz of one chunk, in ``p``'s buffer: -grad p_j, and grad (1 - p_t)
    at the target, with 1 - p_t from :func:`target_gradient_coefficient`."""
    gz = p.mul_(-grad[:, None])
    return gz.scatter_(1, targets[:, None], (grad * coef)[:, None])


def _entropy_logit_grad(logp: Tensor, entropy: Tensor, grad: Tensor) -> Tensor:
    """d(grad . H)/dz of one chunk, in ``logp``'s buffer (all of its log-probs):
    dH/dz_j = -p_j (log p_j + H)."""
    return torch.exp(logp).mul_(logp.add_(entropy[:, None])).mul_(-grad[:, None])


def _chunked_logp_lse(hidden: Tensor, weight: Tensor, targets: Tensor, rows: int):
    """fp32 log-probs of the targets and logsumexps, ``rows`` tokens' logits at a time."""
    logp = hidden.new_empty(hidden.shape[0])
    lse = hidden.new_empty(hidden.shape[0])
    for s in range(0, hidden.shape[0], rows):
        logp[s : s + rows], lse[s : s + rows] = _chunk_logp(
            _logits(hidden[s : s + rows], weight), targets[s : s + rows]
        )
    return logp, lse


def _head_backward(
    ctx, hidden: Tensor, weight: Tensor, logit_grad: Callable[[slice], Tensor]
) -> tuple[Tensor | None, Tensor | None]:
    """The hidden states' and the weight's gradients of a chunked head kernel, where
    ``logit_grad(rows)`` gives one chunk's gradient for its logits (each chunk's logits are
    recomputed there, never all held at once)."""
    need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    grad_h = torch.zeros_like(hidden) if need_h else None
    grad_w = torch.zeros_like(weight) if need_w else None
    times_weight = _times_weight(weight) if need_h else None
    for s in range(0, hidden.shape[0], ctx.rows):
        sl = slice(s, s + ctx.rows)
        gz = logit_grad(sl)
        if need_h:
            grad_h[sl] = times_weight(gz)
        if need_w:
            grad_w.addmm_(gz.T, hidden[sl])
    return grad_h, grad_w


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, rows: int, softmax_fix: bool):
        logp, lse = _chunked_logp_lse(hidden, weight, targets, rows)
        ctx.save_for_backward(hidden, weight, targets, lse, logp)
        ctx.rows, ctx.softmax_fix = rows, softmax_fix
        return logp

    @staticmethod
    def backward(ctx, grad):
        # each chunk's logits recomputed from the saved lse; also _CceForwardLogprob's backward
        hidden, weight, targets, lse, logp = ctx.saved_tensors

        def logit_grad(sl: slice) -> Tensor:
            p = _logits(hidden[sl], weight).sub_(lse[sl, None]).exp_()
            p_target = p.gather(1, targets[sl, None]).squeeze(1)
            coef = target_gradient_coefficient(logp[sl], p_target, ctx.softmax_fix)
            return _logp_logit_grad(p, targets[sl], grad[sl], coef)

        return (*_head_backward(ctx, hidden, weight, logit_grad), None, None, None)


class _CceForwardLogprob(_ChunkedLogprob):
    """Cut Cross-Entropy's fused forward on fp32 inputs, then the exact chunked fp32 backward.

    CCE's own backward kernel takes only bf16/fp16 embeddings (cut-cross-entropy 25.1 asserts
    it), and feeding it 16-bit inputs would give up the fp32 log-probs this module exists for.
    Its forward runs in fp32 and never holds the logits; the backward recomputes each chunk's
    logits from lse = z_target - logp, as :class:`_ChunkedLogprob` does.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows: int, softmax_fix: bool):
        from cut_cross_entropy import linear_cross_entropy

        loss = linear_cross_entropy(hidden, weight, targets, reduction="none", filter_eps=None)
        logp = -loss.float()
        lse = (hidden * weight[targets]).sum(-1) - logp
        if softmax_fix:
            # The kernel rounds 1 - p to 0 for confident tokens; rescore those rows exactly.
            sure = (logp > _CCE_RECOMPUTE_LOGP).nonzero().squeeze(1)
            if sure.numel():
                logp[sure], lse[sure] = _chunked_logp_lse(hidden[sure], weight, targets[sure], rows)
        ctx.save_for_backward(hidden, weight, targets, lse, logp)
        ctx.rows, ctx.softmax_fix = rows, softmax_fix
        return logp  # the backward is _ChunkedLogprob's


class _ChunkedEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, rows: int):
        out = hidden.new_empty(hidden.shape[0])
        lse = hidden.new_empty(hidden.shape[0])
        for s in range(0, hidden.shape[0], rows):
            z = _logits(hidden[s : s + rows], weight)
            m = z.amax(-1, keepdim=True)
            z.sub_(m)
            e = z.exp()
            total = e.sum(-1)
            lse[s : s + rows] = m.squeeze(1) + torch.log(total)
            # H = lse - sum p z = log(total) - sum(e * (z - m)) / total
            out[s : s + rows] = torch.log(total) - e.mul_(z).sum(-1) / total
        ctx.save_for_backward(hidden, weight, lse, out)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, lse, ent = ctx.saved_tensors

        def logit_grad(sl: slice) -> Tensor:
            logp = _logits(hidden[sl], weight).sub_(lse[sl, None])
            return _entropy_logit_grad(logp, ent[sl], grad[sl])

        return (*_head_backward(ctx, hidden, weight, logit_grad), None)


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """:class:`_ChunkedLogprob` and :class:`_ChunkedEntropy` in one pass over the vocabulary:
    each chunk's logits are computed once in forward and once in backward, not twice each.
    The forward's values are bitwise those of the two Functions (the same operations in the
    same order); the backward sums the two logit gradients before the one product with the
    weight, so it agrees with theirs to rounding."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows: int, softmax_fix: bool):
        n = hidden.shape[0]
        logp, ent, lse = (hidden.new_empty(n) for _ in range(3))
        for s in range(0, n, rows):
            sl = slice(s, s + rows)
            z = _logits(hidden[sl], weight)
            m = z.amax(-1, keepdim=True)
            zt = z.gather(1, targets[sl, None]).squeeze(1)
            shifted = z.sub_(m)
            e = shifted.exp()
            total = e.sum(-1)
            m = m.squeeze(1)
            lse[sl] = m + torch.log(total)
            ent[sl] = torch.log(total) - shifted.mul_(e).sum(-1) / total  # _ChunkedEntropy's H
            logp[sl] = _target_logp(e, zt, m, targets[sl])
        ctx.save_for_backward(hidden, weight, targets, lse, logp, ent)
        ctx.rows, ctx.softmax_fix = rows, softmax_fix
        return torch.stack([logp, ent], -1)

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets, lse, logp, ent = ctx.saved_tensors

        def logit_grad(sl: slice) -> Tensor:
            log_p = _logits(hidden[sl], weight).sub_(lse[sl, None])
            p = log_p.exp()
            p_target = p.gather(1, targets[sl, None]).squeeze(1)
            coef = target_gradient_coefficient(logp[sl], p_target, ctx.softmax_fix)
            gz = _entropy_logit_grad(log_p, ent[sl], grad[sl, 1])
            return gz.add_(_logp_logit_grad(p, targets[sl], grad[sl, 0], coef))

        return (*_head_backward(ctx, hidden, weight, logit_grad), None, None, None)


def _resolve_impl(impl: str, device: torch.device) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "cce" if device.type == "cuda" else "chunked"
    if impl == "cce" and device.type != "cuda":
        raise ValueError("impl='cce' needs a CUDA device; use impl='chunked' (or 'auto') on CPU")
    return impl


def round_to_bf16(logp: Tensor) -> Tensor:
    """Emulate log-probs stored in bf16 (the bias of Thm 3), straight-through in backward."""
    return logp + (bf16_round(logp) - logp).detach()


def _head_inputs(
    hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The checked fp32 rows ``hidden / temperature`` [N, D], weight [V, D] and targets [N]."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal hidden.shape[:-1]")
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden size {hidden.shape[-1]} != weight's {weight.shape[-1]}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _check_targets(targets, weight.shape[0])
    h = hidden.reshape(-1, hidden.shape[-1]).float()
    if temperature != 1.0:
        h = h / temperature
    return h, weight.float(), targets.reshape(-1).long()


def token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    impl: str = "auto",
    chunk_size: int | None = None,
    softmax_fix: bool = True,
    bf16_round_logprobs: bool = False,
    temperature: float = 1.0,
) -> Tensor:
    """fp32 log softmax(hidden @ weight.T / temperature)[targets], without the full logits.

    hidden ``[..., D]`` (any float dtype; cast to fp32), weight ``[V, D]``, targets ``[...]``.
    Differentiable with respect to hidden and weight.
    """
    impl = _resolve_impl(impl, hidden.device)
    h, w, t = _head_inputs(hidden, weight, targets, temperature)
    rows = _chunk_rows(w.shape[0], chunk_size)
    if impl == "chunked":
        logp = _ChunkedLogprob.apply(h, w, t, rows, softmax_fix)
    elif impl == "cce":
        logp = _CceForwardLogprob.apply(h, w, t, rows, softmax_fix)
    else:
        from cut_cross_entropy import linear_cross_entropy

        logp = -linear_cross_entropy(h, w, t, reduction="none", impl=impl).float()
        if softmax_fix:
            # The compiled path rounds 1 - p to 0 for confident tokens; rescore those exactly.
            sure = (logp.detach() > _CCE_RECOMPUTE_LOGP).nonzero().squeeze(1)
            if sure.numel():
                exact = _ChunkedLogprob.apply(h[sure], w, t[sure], rows, True)
                logp = logp.index_put((sure,), exact)
    if bf16_round_logprobs:
        logp = round_to_bf16(logp)
    return logp.reshape(targets.shape)


def token_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    impl: str = "auto",
    chunk_size: int | None = None,
    softmax_fix: bool = True,
    bf16_round_logprobs: bool = False,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """:func:`token_logprobs` and :func:`token_entropy` of the same positions. With the
    chunked kernel (the CPU's) one pass over the vocabulary gives both
    (:class:`_ChunkedLogprobEntropy`); other kernels compute them one after the other."""
    if _resolve_impl(impl, hidden.device) != "chunked":
        opts = {
            "impl": impl,
            "softmax_fix": softmax_fix,
            "bf16_round_logprobs": bf16_round_logprobs,
        }
        logp = token_logprobs(hidden, weight, targets, chunk_size=chunk_size,
                              temperature=temperature, **opts)  # fmt: skip
        return logp, token_entropy(hidden, weight, chunk_size=chunk_size, temperature=temperature)
    h, w, t = _head_inputs(hidden, weight, targets, temperature)
    both = _ChunkedLogprobEntropy.apply(h, w, t, _chunk_rows(w.shape[0], chunk_size), softmax_fix)
    logp, ent = both[:, 0], both[:, 1]
    if bf16_round_logprobs:
        logp = round_to_bf16(logp)
    return logp.reshape(targets.shape), ent.reshape(targets.shape)


def token_entropy(
    hidden: Tensor,
    weight: Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> Tensor:
    """Exact fp32 entropy of softmax(hidden @ weight.T / temperature) per position.

    Differentiable, computed in token chunks; pays the full-vocabulary cost by design
    (diagnostics and the GRPO + entropy bonus baseline).
    """
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden size {hidden.shape[-1]} != weight's {weight.shape[-1]}")
    h = hidden.reshape(-1, hidden.shape[-1]).float()
    if temperature != 1.0:
        h = h / temperature
    w = weight.float()
    ent = _ChunkedEntropy.apply(h, w, _chunk_rows(w.shape[0], chunk_size))
    return ent.reshape(hidden.shape[:-1])
