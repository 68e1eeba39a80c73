"""The algorithm's loss on one micro-batch, term by term.

:func:`loss_terms` composes the named formula functions in the order the module docstring of
:mod:`entrogym.algos.update` draws (the lever's advantages -> the loss's per-token objective,
x the sampler-mismatch weights -> the lever's adjustment -> the token mask -> aggregation, + the
lever's extra term), keeping each term apart so that a non-finite one can be named
(:mod:`entrogym.algos.step_guard`); :func:`micro_batch_loss` is their sum.
"""

from __future__ import annotations

import dataclasses

import torch

from entrogym.algos.algorithm import AlgorithmConfig
from entrogym.algos.correction import sampler_weights
from entrogym.algos.entropy_control import EntropyControl
from entrogym.algos.lever_hooks import LeverInputs
from entrogym.algos.losses import LOSSES, TokenObjective, aggregate
from entrogym.algos.update_batch import Rows


def micro_batch_loss(
    control: EntropyControl,
    rows: Rows,
    logprobs: torch.Tensor,
    entropies: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """The algorithm's loss on one micro-batch: the sum of :func:`loss_terms`. Also returns
    the metrics and the mask of the tokens the loss trains on."""
    terms, metrics, trained = loss_terms(control, rows, logprobs, entropies, generator)
    policy, *extra = terms.values()
    return (policy + extra[0] if extra else policy), metrics, trained


def loss_terms(
    control: EntropyControl,
    rows: Rows,
    logprobs: torch.Tensor,
    entropies: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float], torch.Tensor]:
    """The terms of the algorithm's loss on one micro-batch, by a name an error can show: the
    policy loss (the lever's advantages -> the policy loss's per-token objective (x the
    sampler-mismatch weights, with ``algo.is_correction``) -> the lever's adjustment -> the
    token mask -> aggregation) and the lever's extra term where it has one. Also returns the
    metrics and the mask of the tokens the loss trains on.

    The importance weights scale the policy-gradient term only, as TRL's do: what an entropy
    lever adds to the objective (KL-Cov's penalty, the entropic term) or to the loss (the
    entropy bonus) is not weighted."""
    config, lever, coef = control.config, control.lever, control.coefficient
    advantages = lever.shape_advantages(rows.advantages, logprobs, entropies, coef, rows.mask)
    eps_low, eps_high = control.clip_range()
    loss_fn = LOSSES.get(config.loss.name)
    terms = loss_fn(
        logprobs, rows.old_logprobs, advantages, rows.mask, config.loss.params, eps_low, eps_high
    )
    terms, metrics = _sampler_corrected(config, rows, terms)
    inputs = LeverInputs(logprobs, rows.old_logprobs, generator)
    objective, lever_metrics = lever.adjust_objective(terms, inputs, coef)
    metrics.update(lever_metrics)
    trained = rows.mask
    keep = control.mask.keep(terms.mask, entropies)
    if keep is not None:
        objective = objective * keep.to(objective.dtype)
        metrics["token_mask_share"] = float(keep.sum() / (terms.mask > 0).sum())
        trained = keep.to(rows.mask.dtype)  # the bonus acts on the kept tokens too (as TRL's)
    loss = -aggregate(objective, terms.mask, config.loss.params.aggregation)
    extra = lever.extra_loss(
        logprobs, entropies, trained, coef, advantages=advantages, target=control.lever_target
    )
    shaped = "" if config.lever.name == "none" else f", lever {config.lever.name!r}"
    parts = {f"the policy loss (loss {config.loss.name!r}{shaped})": loss}
    if extra is not None:
        parts[f"the extra_loss of lever {config.lever.name!r}"] = extra
    return parts, {**terms.metrics, **metrics}, trained


def _sampler_corrected(
    config: AlgorithmConfig, rows: Rows, terms: TokenObjective
) -> tuple[TokenObjective, dict[str, float]]:
    """``terms`` with the objective weighted by :func:`sampler_weights` of the learner's old
    log-probs (the fp32 rescoring of the sampling policy) over the engine's, as TRL's
    ``vllm_importance_sampling_correction`` does; unchanged when ``config`` sets no mode."""
    if config.is_correction is None:
        return terms, {}
    if rows.sampler_logprobs is None:
        raise ValueError(
            f"algo.is_correction {config.is_correction!r} needs the engine's log-probs "
            "(UpdateBatch.sampler_logprobs), and this batch has none; set it to none here"
        )
    weights = sampler_weights(
        rows.old_logprobs, rows.sampler_logprobs, rows.mask, config.is_correction,
        config.is_clip_min, config.is_clip_max,
    )  # fmt: skip
    action = rows.mask > 0
    tokens = action.sum().clamp_min(1)  # weights are 0 off the mask
    metrics = {
        "is_weight_mean": float(weights.sum() / tokens),
        "is_weight_zero_share": float(((weights == 0) & action).sum() / tokens),
    }
    objective = terms.objective * weights.to(terms.objective.dtype)
    return dataclasses.replace(terms, objective=objective), metrics
