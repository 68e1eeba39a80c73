"""Exact fp32 log-probs of the tokens of whole sequences, and exact entropies, from a causal LM.

The importance ratio of every algorithm is exp(logp_new - logp_old); the paper (Sec. 4,
appendix "Numerical considerations", Thm 3) shows that computing these log-probs in bf16
biases the ratio. The LM head's product runs in fp32 from fp32-upcast hidden states, without
the ``[tokens, vocab]`` logits (kernels in :mod:`entrogym.train.learner.lm_head_kernels`).

Two exact ways to do less work (both default off, so the defaults are the original path):

* ``score_mask``: the LM head, the log-softmax and the entropy run only at the positions a
  loss reads (the action tokens; the mask is known before scoring). The body still sees every
  token. Other positions are 0 in the ``[B, T]`` output, as padding is.
* ``layout``: how the rows reach the body. ``"padded"`` as given; ``"trimmed"`` drops the
  columns that are padding in every row (the micro-batch shrinks to its own longest row);
  ``"packed"`` concatenates the real tokens of all rows into one padding-free row whose
  position ids restart at 0 for each sequence (transformers then builds a block-diagonal
  causal mask from the position ids, as TRL's and verl's padding-free training do);
  ``"shared-prefix"`` runs the opening the rows share (a multi-turn env's system prompt, tools
  and worked examples) once, then the rest of every row packed into one padding-free row that
  attends to the opening's cache and causally within its own row (a 4-D mask); with
  ``score_mask`` only, and only where no scored token lies in the opening. The gradient reaches
  the opening through the cache. Where the rows share fewer than
  ``MIN_SHARED_PREFIX`` tokens it is ``"trimmed"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from entrogym.train.learner.lm_head_kernels import (  # noqa: F401  (re-exported: the public kernels)
    DEFAULT_CHUNK_ELEMENTS,
    IMPLS,
    SOFTMAX_FIX_LOGP_THRESHOLD,
    _check_targets,
    round_to_bf16,
    target_gradient_coefficient,
    token_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)

LAYOUTS = ("padded", "trimmed", "packed", "shared-prefix")
# below this many shared tokens a second forward call costs more than it saves
MIN_SHARED_PREFIX = 16


def lm_head_weight(model: torch.nn.Module) -> Tensor:
    return _lm_head(model).weight


def _lm_head(model: torch.nn.Module) -> torch.nn.Module:
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        raise ValueError(f"{type(model).__name__} has no linear LM head (get_output_embeddings)")
    if hasattr(head, "lora_A"):
        raise ValueError(
            "the LM head carries a LoRA adapter; exact log-probs need a plain head: "
            "leave lm_head out of the LoRA target modules (the default)"
        )
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None):
        raise ValueError("models with final_logit_softcapping are not supported")
    return head


@contextlib.contextmanager
def _head_replaced(head: torch.nn.Module, fn: Callable[[Tensor, Tensor], Tensor]) -> Iterator[None]:
    """Make the LM head call ``fn(hidden, weight)`` instead of computing logits.

    Going through the model's own forward (rather than calling the decoder body directly)
    keeps FSDP2's root hooks in charge of unsharding the embedding, norm and head weights.
    """
    # accelerate's hooks live in an instance-level ``forward``; put back whatever was there.
    saved = head.__dict__.get("forward")
    head.forward = lambda hidden: fn(hidden, head.weight)
    try:
        yield
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


@dataclass(frozen=True)
class _Plan:
    """What the body sees, and where each scored output position reads its hidden state."""

    input_ids: Tensor
    attention_mask: Tensor | None
    position_ids: Tensor
    source: Tensor  # [N] row of hidden.reshape(-1, D) that predicts each scored token
    rows: Tensor  # [N] output coordinates of the scored tokens
    cols: Tensor
    targets: Tensor  # [N] the scored token ids
    opening: int = 0  # shared-prefix: columns run once before, whose cache every row attends to


def _check_inputs(
    input_ids: Tensor, attention_mask: Tensor | None, score_mask: Tensor | None, layout: str
) -> Tensor:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    if score_mask is not None and score_mask.shape != input_ids.shape:
        raise ValueError(
            f"score_mask must have the shape of input_ids {tuple(input_ids.shape)}, got "
            f"{tuple(score_mask.shape)}; pass the batch's action_mask (1 at sampled tokens)"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return attention_mask.bool()


def _scored(mask: Tensor, score_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(rows, prev)`` of the scored tokens, row-major: both tokens real (and, with
    ``score_mask``, the target an action); token ``(row, prev + 1)`` is read from ``prev``."""
    valid = mask[:, 1:] & mask[:, :-1]
    if score_mask is not None:
        valid = valid & score_mask[:, 1:].bool()
    return valid.nonzero(as_tuple=True)  # row-major: the order of hidden[:, :-1][valid]


def _plan(input_ids: Tensor, mask: Tensor, score_mask: Tensor | None, layout: str) -> _Plan:
    """What the body sees for ``layout``, and where each scored token reads its hidden state."""
    b, t = input_ids.shape
    rows, prev = _scored(mask, score_mask)
    cols = prev + 1
    targets = input_ids[rows, cols]
    if layout == "shared-prefix":
        p = shared_prefix_length(input_ids, mask, score_mask)
        if p >= MIN_SHARED_PREFIX:
            rest = mask[:, p:]  # rows are right-padded: each row's real tokens after the opening
            lengths = rest.sum(1)
            starts = lengths.cumsum(0) - lengths  # where each row begins in the packed row
            return _Plan(
                input_ids[:, p:][rest][None],
                _packed_after_opening(lengths, p),
                (rest.long().cumsum(1) - 1 + p)[rest][None],
                starts[rows] + (prev - p),
                rows,
                cols,
                targets,
                opening=p,
            )
        layout = "trimmed"
    # Positions count real tokens only, so left padding gives the positions the sampler used.
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    if layout == "packed" and mask.any():
        flat = mask.reshape(-1)
        packed_index = flat.long().cumsum(0) - 1
        return _Plan(
            input_ids.reshape(-1)[flat][None],
            None,  # no 2-D mask: transformers derives the per-sequence blocks from position ids
            position_ids.reshape(-1)[flat][None],
            packed_index[rows * t + prev],
            rows,
            cols,
            targets,
        )
    lo, hi = 0, t
    if layout == "trimmed" and mask.any():
        real = mask.any(0).nonzero().squeeze(1)
        lo, hi = int(real[0]), int(real[-1]) + 1
    return _Plan(
        input_ids[:, lo:hi],
        mask[:, lo:hi].long(),
        position_ids[:, lo:hi],
        rows * (hi - lo) + (prev - lo),
        rows,
        cols,
        targets,
    )


def shared_prefix_length(input_ids: Tensor, mask: Tensor, score_mask: Tensor | None) -> int:
    """Columns ``[0, p)`` that every row holds as real, equal tokens, and whose hidden states
    no scored token reads (a scored token at column ``c`` reads position ``c - 1``, so
    ``p <= c - 1``); 0 for one row or without ``score_mask``. Rows are right-padded."""
    if input_ids.shape[0] < 2 or score_mask is None:
        return 0
    shared = mask.all(0) & (input_ids == input_ids[:1]).all(0)
    p = int(shared.long().cumprod(0).sum())
    _, prev = _scored(mask, score_mask)
    if len(prev):  # column c - 1 of the first scored token c, as a prefix length
        p = min(p, int(prev.min()))
    return p


def _packed_after_opening(lengths: Tensor, p: int) -> Tensor:
    """``[1, 1, S, p + S]`` mask (True: attend) of rows packed after a shared opening of ``p``
    tokens (``lengths``: each row's tokens after it, ``S`` their sum): every token sees the
    whole opening and the earlier tokens of its own row."""
    row = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    at = torch.arange(len(row), device=lengths.device)
    own = (row[:, None] == row[None, :]) & (at[:, None] >= at[None, :])
    return torch.cat([own.new_ones(len(row), p), own], 1)[None, None]


def _opening_cache(model: torch.nn.Module, head: torch.nn.Module, input_ids: Tensor, p: int):
    """The KV cache of the first ``p`` columns of row 0 (the opening every row shares), with
    gradients: it is the past of every row's packed rest."""
    with _head_replaced(head, lambda hidden, weight: hidden[..., :0]):  # no head: the cache
        out = model(input_ids=input_ids[:1, :p],
                    position_ids=torch.arange(p, device=input_ids.device)[None],
                    use_cache=True)  # fmt: skip
    return out.past_key_values


def _score_sequences(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    score: Callable[[Tensor, Tensor, Tensor], Tensor],
    score_mask: Tensor | None = None,
    layout: str = "padded",
) -> Tensor:
    """Run the model once; ``score(hidden[N,D], weight, targets[N]) -> [N, k]`` at the scored
    next-token positions; returns ``[B, T, k]`` fp32 with zeros at position 0, padding and
    unscored positions."""
    mask = _check_inputs(input_ids, attention_mask, score_mask, layout)
    head = _lm_head(model)
    _check_targets(input_ids, head.weight.shape[0])
    plan = _plan(input_ids, mask, score_mask, layout)
    past, attention = None, plan.attention_mask
    if plan.opening:
        past = _opening_cache(model, head, input_ids, plan.opening)
        # an additive 4-D mask: eager attention adds it, SDPA takes it as is
        dtype = next(model.parameters()).dtype
        attention = torch.zeros(attention.shape, dtype=dtype, device=attention.device)
        attention = attention.masked_fill(~plan.attention_mask, torch.finfo(dtype).min)

    def fn(hidden: Tensor, weight: Tensor) -> Tensor:
        # The head sees only the scored rows: the LM-head cost follows the action tokens.
        scores = score(hidden.reshape(-1, hidden.shape[-1])[plan.source], weight, plan.targets)
        out = scores.new_zeros((*input_ids.shape, scores.shape[-1]))
        out[plan.rows, plan.cols] = scores
        return out

    with _head_replaced(head, fn):
        result = model(
            input_ids=plan.input_ids,
            attention_mask=attention,
            position_ids=plan.position_ids,
            past_key_values=past,
            use_cache=past is not None,
        )
    return result.logits.float()


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    score_mask: Tensor | None = None,
    layout: str = "padded",
    **opts,
) -> Tensor:
    """``[B, T]`` fp32: out[:, t] = log p(input_ids[:, t] | input_ids[:, :t]), out[:, 0] = 0.

    ``opts`` go to :func:`token_logprobs` (impl, chunk_size, softmax_fix,
    bf16_round_logprobs, temperature). Padded positions (attention_mask 0) get 0; with
    ``score_mask`` (``[B, T]``, e.g. the action mask) so do the positions where it is 0.
    ``layout``: one of :data:`LAYOUTS` (module docstring); all give the same values.
    """
    return _score_sequences(
        model,
        input_ids,
        attention_mask,
        lambda h, w, t: token_logprobs(h, w, t, **opts)[:, None],
        score_mask,
        layout,
    )[..., 0]


def sequence_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    score_mask: Tensor | None = None,
    layout: str = "padded",
    **opts,
) -> tuple[Tensor, Tensor]:
    """One forward pass: the log-probs of :func:`sequence_logprobs` and, at the same
    positions, the exact entropy of the distribution each token was drawn from."""

    def both(h: Tensor, w: Tensor, t: Tensor) -> Tensor:
        return torch.stack(token_logprobs_and_entropy(h, w, t, **opts), -1)

    out = _score_sequences(model, input_ids, attention_mask, both, score_mask, layout)
    return out[..., 0], out[..., 1]
