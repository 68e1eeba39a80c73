"""Sampler checks: is the rollout engine scoring, and sampling, the trainer's policy?

Two diagnostics of the rollout engine, both against the trainer's exact fp32 scores:

* :func:`sampler_mismatch`: the engine's log-probs of the sampled tokens against the trainer's.
  The trainer recomputes old log-probs itself (paper Sec. 4, appendix "Numerical
  considerations"), so this is a diagnostic: the same tokens scored by the sampler (vLLM in
  bf16 or fp32) and by the trainer (fp32) should give importance ratios near 1. A ratio outside
  [0.9, 1.1] on a token is what clipping with eps = 0.1 would act on though the policy did not
  change.
* :func:`sampler_entropy_gap`: whether the tokens were *drawn* from the policy. A sampler that
  truncates (top-k, top-p, min-p) reports exact log-probs for the tokens it picks, so the
  mismatch metric cannot see it; the sampled -log pi then falls below the policy's entropy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from entrogym.agents.engines import Engine, SamplingParams
from entrogym.agents.episode import Episode
from entrogym.train.batch import collate_episodes
from entrogym.train.learner.logprobs import sequence_logprobs, sequence_logprobs_and_entropy

# |z| above this fails the entropy check: an exact sampler passes with probability ~1 - 6e-5.
ENTROPY_GAP_MAX_Z = 4.0


def _select(mask: Tensor, *tensors: Tensor) -> list[Tensor]:
    """The masked entries of ``tensors`` (fp64), after checking shapes and a non-empty mask."""
    shapes = [tuple(t.shape) for t in (*tensors, mask)]
    if len(set(shapes)) != 1:
        raise ValueError(f"the scores and the mask must have one shape, got {shapes}")
    sel = mask.bool()
    if not bool(sel.any()):
        raise ValueError("mask selects no tokens; pass the action mask of sampled tokens")
    return [t.double()[sel] for t in tensors]


def sampler_mismatch(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    low: float = 0.9,
    high: float = 1.1,
) -> dict[str, float | int | None]:
    """Compare log-probs of the same tokens over the action ``mask``.

    With diff = trainer - sampler and ratio = exp(diff) (the importance ratio pi_trainer /
    pi_sampler): ``mean_abs_diff``, ``max_abs_diff``, ``mean_diff`` (signed),
    ``frac_ratio_outside`` (share of tokens whose ratio leaves [low, high]) and ``num_tokens``
    (tokens compared). Tokens with a non-finite log-prob on either side are left out and
    counted in ``sampler_nonfinite`` / ``trainer_nonfinite``; if none is left the four
    statistics are None. Nothing returned is NaN, so a metrics row stays strict JSON.
    """
    trainer, sampler = _select(mask, trainer_logprobs, sampler_logprobs)
    ok_t, ok_s = torch.isfinite(trainer), torch.isfinite(sampler)
    keep = ok_t & ok_s
    diff = trainer[keep] - sampler[keep]
    counts = {
        "num_tokens": int(diff.numel()),
        "sampler_nonfinite": int((~ok_s).sum()),
        "trainer_nonfinite": int((~ok_t).sum()),
    }
    if diff.numel() == 0:
        none = dict.fromkeys(("mean_abs_diff", "max_abs_diff", "mean_diff", "frac_ratio_outside"))
        return {**none, **counts}
    ratio = diff.exp()
    return {
        "mean_abs_diff": float(diff.abs().mean()),
        "max_abs_diff": float(diff.abs().max()),
        "mean_diff": float(diff.mean()),
        "frac_ratio_outside": float(((ratio < low) | (ratio > high)).double().mean()),
        **counts,
    }


# The mismatch row of a batch whose old log-probs are the engine's own (``TrainConfig.
# old_logprobs`` sampler): nothing is compared, so nothing is reported as if measured.
UNMEASURED_MISMATCH: dict[str, float | int | None] = {
    "mean_abs_diff": None,
    "max_abs_diff": None,
    "mean_diff": None,
    "frac_ratio_outside": None,
    "num_tokens": 0,
    "sampler_nonfinite": 0,
    "trainer_nonfinite": 0,
}


def sampler_scores_usable(sampler_logprobs: Tensor, mask: Tensor) -> bool:
    """Whether the engine's log-probs can stand in for the trainer's as old log-probs: finite
    at every action token of ``mask`` (a non-finite one would make its ratio NaN)."""
    return bool(torch.isfinite(sampler_logprobs[mask.bool()]).all())


def sampler_entropy_gap(
    logprobs: Tensor, entropies: Tensor, mask: Tensor
) -> dict[str, float | int | None]:
    """Did the sampler draw from the policy? Sampled -log pi against the exact entropy.

    The entropy controllers estimate H_pi by the mean sampled -log pi(a_t | s_t) (paper
    Sec. "Explicit Entropy Control Methods"; step 1 of the REPO controller). If a_t ~ pi(. | s_t)
    then E[-log pi(a_t | s_t) | s_t] = H(pi(. | s_t)), so d_t = -log pi(a_t | s_t) - H_t has
    mean 0 given everything before it. The d_t are then martingale differences (uncorrelated,
    though positions of one sequence depend on each other), and their mean over n tokens has
    standard error std(d) / sqrt(n). A truncating sampler (top-k, top-p) drops unlikely tokens
    and makes the mean negative.

    Args: ``logprobs`` (the trainer's exact log-probs of the sampled tokens), ``entropies``
    (the exact entropies at the same positions, e.g. both from
    ``entrogym.train.learner.logprobs.sequence_logprobs_and_entropy`` at the sampling temperature) and
    the action ``mask``, all of one shape.

    Returns ``gap`` (mean -log pi minus mean entropy, nats), ``stderr``, ``z`` (gap / stderr;
    the check fails when |z| > :data:`ENTROPY_GAP_MAX_Z`), ``mean_neg_logprob``,
    ``mean_entropy``, ``num_tokens`` and ``nonfinite`` (positions left out). ``z`` and
    ``stderr`` are None below 2 tokens.
    """
    logp, ent = _select(mask, logprobs, entropies)
    keep = torch.isfinite(logp) & torch.isfinite(ent)
    d = -logp[keep] - ent[keep]
    n = int(d.numel())
    out: dict[str, float | int | None] = {
        "gap": float(d.mean()) if n else None,
        "stderr": None,
        "z": None,
        "mean_neg_logprob": float(-logp[keep].mean()) if n else None,
        "mean_entropy": float(ent[keep].mean()) if n else None,
        "num_tokens": n,
        "nonfinite": int((~keep).sum()),
    }
    if n >= 2:
        # floor: a deterministic policy has d = 0 exactly, and z must stay finite for JSON
        stderr = max(float(d.std()) / math.sqrt(n), 1e-12)
        out["stderr"], out["z"] = stderr, float(d.mean()) / stderr
    return out


def score_episodes(
    model: torch.nn.Module,
    episodes: Sequence[Episode],
    *,
    batch_size: int = 8,
    pad_token_id: int = 0,
    with_entropy: bool = False,
    **logprob_opts: Any,
) -> tuple[Tensor, ...]:
    """Trainer log-probs of ``episodes``' tokens with ``model`` (fp32, ``sequence_logprobs``).

    Returns ``(trainer_logprobs, sampler_logprobs, action_mask)``, each ``[B, T]``, and with
    ``with_entropy`` the exact entropies at the same positions after them.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batch = collate_episodes(episodes, pad_token_id)
    device = next(model.parameters()).device
    logp = torch.zeros_like(batch.sampler_logprobs)
    ent = torch.zeros_like(batch.sampler_logprobs)
    with torch.no_grad():
        for start in range(0, len(batch), batch_size):
            rows = slice(start, start + batch_size)
            ids, att = batch.input_ids[rows].to(device), batch.attention_mask[rows].to(device)
            if with_entropy:
                lp, h = sequence_logprobs_and_entropy(model, ids, att, **logprob_opts)
                logp[rows], ent[rows] = lp.cpu(), h.cpu()
            else:
                logp[rows] = sequence_logprobs(model, ids, att, **logprob_opts).cpu()
    scored = (logp, batch.sampler_logprobs, batch.mask)
    return (*scored, ent) if with_entropy else scored


def episodes_mismatch(
    model: torch.nn.Module, episodes: Sequence[Episode], **kwargs: Any
) -> dict[str, float | int | None]:
    """:func:`sampler_mismatch` of ``episodes`` scored by ``model`` (see :func:`score_episodes`)."""
    low, high = kwargs.pop("low", 0.9), kwargs.pop("high", 1.1)
    trainer, sampler, mask = score_episodes(model, episodes, **kwargs)
    return sampler_mismatch(trainer, sampler, mask, low=low, high=high)


def episodes_entropy_gap(
    model: torch.nn.Module, episodes: Sequence[Episode], **kwargs: Any
) -> dict[str, float | int | None]:
    """:func:`sampler_entropy_gap` of ``episodes`` scored by ``model`` (pass the sampling
    ``temperature`` if it is not 1; other options as :func:`score_episodes`)."""
    logp, _, mask, ent = score_episodes(model, episodes, with_entropy=True, **kwargs)
    return sampler_entropy_gap(logp, ent, mask)


def engine_entropy_gap(
    engine: Engine,
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    *,
    samples: int = 32,
) -> dict[str, float | int | None]:
    """Self-check of an engine's sampler: ``samples`` completions of ``prompt_ids`` with
    ``params``, scored exactly by ``model`` (the policy the engine serves, base weights) at
    the sampling temperature; returns :func:`sampler_entropy_gap`. An engine that samples the
    policy gives |z| <= :data:`ENTROPY_GAP_MAX_Z`; aim for 1000 sampled tokens or more."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if params.temperature <= 0:
        raise ValueError("params.temperature must be > 0: greedy decoding has no entropy to check")
    prompt = [int(t) for t in prompt_ids]
    out = engine.generate([prompt] * samples, params)
    width = len(prompt) + max(len(c.token_ids) for c in out)
    ids = torch.zeros((samples, width), dtype=torch.long)
    attention = torch.zeros((samples, width), dtype=torch.long)
    for row, c in enumerate(out):
        ids[row, : len(prompt) + len(c.token_ids)] = torch.tensor(prompt + c.token_ids)
        attention[row, : len(prompt) + len(c.token_ids)] = 1
    mask = attention.clone()
    mask[:, : len(prompt)] = 0
    device = next(model.parameters()).device
    with torch.no_grad():
        logp, ent = sequence_logprobs_and_entropy(
            model, ids.to(device), attention.to(device), temperature=params.temperature
        )
    return sampler_entropy_gap(logp.cpu(), ent.cpu(), mask)
