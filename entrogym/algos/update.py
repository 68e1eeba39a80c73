"""One iteration's policy update, composed from the named formula functions.

The same code drives the LLM trainer and the bandit lab, so what the lab shows about a preset
is what the trainer does with it. The caller supplies how to score rows (an LLM forward pass, or
a lookup in a logit table), how to back-propagate (fp16 loss scaling), how to take an optimizer
step (unscale, clip, step) and how to clear gradients; everything algorithmic happens here:

    for each epoch, for each minibatch:
        zero_grad()
        for each micro-batch: score (+ entropies if control.needs_entropy)
                              -> lever.shape_advantages -> the loss's per-token objective
                              (x sampler_weights, with algo.is_correction)
                              -> lever.adjust_objective -> token mask -> aggregate
                              (+ lever.extra_loss, told control.target)
                              -> backward(weighted loss)
        step()                      (skipped when any part was non-finite)
        [controller fed every optimizer step: observe_step(the minibatch's exact entropy)]
    [controller fed every iteration: observe(the experience's entropy, by its estimator)]

The advantages are computed once, in ``UpdateBatch.build``. By default (the paper's) the
controller moves once per iteration, after the update, from the entropy of the experience the
iteration was trained on; its target is the entropy of the first iteration (paper Sec. 5). The
controller's ``estimator`` says which estimate of that entropy it tracks: the mean exact token
entropy over the batch's action tokens (``exact``; the scorer then returns entropies, and a
batch whose old log-probs the caller supplies pays one no-grad entropy pass before the first
step) or the sampled surprisal (``sampled``); with ``probe`` it tracks the caller's measure of
the policy on fixed states, handed over before the update (``EntropyControl.observe_states``).
Every update reports both batch estimates where they were computed, ``entropy`` (sampled)
and ``entropy_exact``, and ``entropy_tracked``, the one the controller saw.

Old log-probs: when ``batch.old_logprobs`` is ``None`` the update scores them itself. The rows of
the first minibatch of the first epoch are still on-policy when they are scored for the loss,
so their detached scores are their old log-probs (no separate pass); the other rows are scored
without gradients before the first optimizer step. With a deterministic scorer this equals
scoring every row first.

Stale batches (``version`` given, rows sampled by older ``batch.versions``): the caller passes
the sampling versions' log-probs as old log-probs, so every ratio's denominator is the policy
that sampled its token. The entropy the controller sees is the policy being trained: the first
minibatch's detached scores (taken before the first step, so they are that policy's) weighted
against the sampler's (``importance_weighted_entropy``), or, tracking the exact entropy, the
mean of the same scores' exact entropies over that minibatch's action tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from entrogym.algos.advantages import zero_advantage_groups
from entrogym.algos.algorithm import AlgorithmConfig
from entrogym.algos.entropy import importance_weighted_entropy, sampled_entropy
from entrogym.algos.entropy_control import EntropyControl
from entrogym.algos.micro_loss import loss_terms, micro_batch_loss
from entrogym.algos.step_guard import StepGuard, blame_nonfinite
from entrogym.algos.update_batch import (
    UpdateBatch,
    micro_weight,
    minibatch_count,
    minibatch_indices,
)

# score(index, need_entropy) -> (log-probs [b, w] of rows ``index``'s sampled tokens under the
# current policy, w = batch.width(index); exact per-token entropies [b, w] or None when not
# needed). Called with gradients for the loss and under torch.no_grad() for old log-probs.
ScoreFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
# backward(loss): back-propagate one micro-batch's (weighted) loss, accumulating gradients
BackwardFn = Callable[[torch.Tensor], None]
# step() -> True if the optimizer stepped (False e.g. when fp16 scaling found inf grads)
StepFn = Callable[[], bool]
# zero_grad(): clear the accumulated gradients (the update calls it before every minibatch)
ZeroGradFn = Callable[[], None]

# Reported by every update (None where the algorithm has no such coefficient): the built-in
# levers' coefficients under their paper names.
CONTROL_METRICS = ("zeta", "beta", "eps_high", "kl_coef", "clip_cov_ratio")


class _Tally:
    """Micro-batch metrics averaged over the update, and the optimizer steps counted."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.ratio_maxes: list[float] = []
        self.chunks = self.steps = self.skipped = 0
        self.step_entropy = [0.0, 0.0]  # [sum of H over trained tokens, their count]
        # exact H of the policy being trained, before its first step, over the batch's action
        # tokens (a stale batch: its first minibatch's) [sum, count]
        self.exact_entropy = [0.0, 0.0]

    def add(self, metrics: dict[str, float], loss: torch.Tensor) -> None:
        metrics = {**metrics, "loss": float(loss.detach())}
        self.ratio_maxes.append(metrics.pop("ratio_max"))
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.chunks += 1

    def count_step(self, stepped: bool) -> None:
        self.steps += int(stepped)
        self.skipped += int(not stepped)

    def add_step_entropy(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """Accumulate one micro-batch's exact token entropies for the step's mean."""
        self.step_entropy[0] += float((entropies * mask).sum())
        self.step_entropy[1] += float(mask.sum())

    def add_exact_entropy(self, entropies: torch.Tensor, mask: torch.Tensor) -> None:
        """Accumulate exact token entropies of the policy being trained (rows scored before
        any step of this update) for ``entropy_exact``."""
        self.exact_entropy[0] += float((entropies.detach() * mask).sum())
        self.exact_entropy[1] += float(mask.sum())

    def exact_entropy_mean(self, action_tokens: float) -> float | None:
        """``entropy_exact``: the mean exact token entropy of the policy being trained over the
        ``action_tokens`` tokens scored before the first step, or None unless all were."""
        total, count = self.exact_entropy
        return total / count if count > 0 and count == action_tokens else None

    def pop_step_entropy(self) -> float | None:
        """The token-weighted mean entropy of this optimizer step's minibatch (then reset)."""
        total, count = self.step_entropy
        self.step_entropy = [0.0, 0.0]
        return total / count if count > 0 else None

    def summary(self) -> dict[str, float]:
        out = {key: value / max(self.chunks, 1) for key, value in self.sums.items()}
        out["ratio_max"] = max(self.ratio_maxes, default=float("nan"))
        return out


def score_old_logprobs(
    batch: UpdateBatch,
    rows: torch.Tensor,
    score: ScoreFn,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None = None,
    tally: _Tally | None = None,
    store: bool = True,
) -> None:
    """Store the current policy's log-probs of ``rows`` as old log-probs (no gradients); with
    ``tally``, also its exact entropies there (``entropy_exact``). ``store=False`` keeps the
    batch's old log-probs and only tallies the entropies."""
    if rows.numel() == 0:
        return
    with torch.no_grad():
        for index in batch.micro_batches(rows, micro_batch_size, micro_batch_tokens):
            logprobs, entropies = score(index, tally is not None)
            if store:
                batch.store_old_logprobs(index, logprobs)
            if tally is not None and entropies is not None:
                tally.add_exact_entropy(entropies, batch.rows(index).mask)


def accumulate_minibatch(
    control: EntropyControl,
    batch: UpdateBatch,
    minibatch: torch.Tensor,
    *,
    score: ScoreFn,
    backward: BackwardFn,
    micro_batch_size: int | None,
    tally: _Tally,
    micro_batch_tokens: int | None = None,
    reuse_scores: bool = False,
    generator: torch.Generator | None = None,
    current: torch.Tensor | None = None,
) -> bool:
    """Back-propagate one minibatch micro-batch by micro-batch (gradient accumulation).

    Returns False when a score or loss was non-finite (a diverged model): the caller skips the
    step, counted rather than raised (the formula functions reject such input from callers).
    ``reuse_scores``: the rows are on-policy, so their detached scores become old log-probs.
    ``current``: a ``[B, T]`` buffer that receives the rows' detached scores (the policy before
    this minibatch's step). In both cases the rows' exact entropies, where scored, are tallied
    for ``entropy_exact``.
    """
    finite = True
    minibatch_mask = batch.mask[minibatch]
    before_step = reuse_scores or current is not None
    for index in batch.micro_batches(minibatch, micro_batch_size, micro_batch_tokens):
        if not finite:  # the step is skipped: only old log-probs may still be needed
            if reuse_scores:
                exact = tally if control.needs_entropy else None
                score_old_logprobs(batch, index, score, None, tally=exact)
            continue
        # a tracked exact entropy needs the rows scored before the first step, not later ones
        need = control.loss_needs_entropy or (before_step and control.needs_entropy)
        logprobs, entropies = score(index, need)
        batch.check_scores(index, logprobs)
        if reuse_scores:
            batch.store_old_logprobs(index, logprobs)
        if before_step and entropies is not None:
            tally.add_exact_entropy(entropies, batch.rows(index).mask)
        if current is not None:
            current[index, : logprobs.shape[1]] = logprobs.detach()
        if not torch.isfinite(logprobs.detach()).all():
            finite = False
            continue
        rows = batch.rows(index)
        loss, metrics, trained = micro_batch_loss(control, rows, logprobs, entropies, generator)
        finite = bool(torch.isfinite(loss))
        if finite:
            aggregation = control.config.loss.params.aggregation
            backward(loss * micro_weight(aggregation, rows.mask, minibatch_mask))
        tally.add(metrics, loss)
        if control.steps_per_optimizer_step and entropies is not None:
            tally.add_step_entropy(entropies.detach(), trained)
    return finite


def _other_rows(index: torch.Tensor, n: int) -> torch.Tensor:
    keep = torch.ones(n, dtype=torch.bool)
    keep[index] = False
    return keep.nonzero().flatten()


def policy_update(
    control: EntropyControl,
    batch: UpdateBatch,
    *,
    score: ScoreFn,
    backward: BackwardFn,
    step: StepFn,
    zero_grad: ZeroGradFn,
    micro_batch_size: int | None = None,
    generator: torch.Generator | None = None,
    version: int | None = None,
    micro_batch_tokens: int | None = None,
    on_step: Callable[[], None] | None = None,
    guard: StepGuard | None = None,
) -> dict[str, float | None]:
    """Run ``control.config``'s epochs x minibatches on one iteration's experience.

    Every minibatch starts from zero gradients and a skipped one leaves none behind. Old
    log-probs are the sampling policy's log-probs of the sampled tokens: the trainer's fp32
    scores under the policy that generated them (the engine's own only where the caller trusts
    them, as the trainer's ``old_logprobs sampler`` does); ``None`` lets the update score them
    (module doc) and leaves them in ``batch.old_logprobs``. ``version``: the weight version
    being trained; rows whose ``batch.versions`` are older make the batch stale (module doc).
    The entropy fed to the control is that of the policy being trained:
    ``sampled_entropy(old_logprobs, mask)`` on a fresh batch, ``importance_weighted_entropy``
    on a stale one (``entropy_sampler`` in the metrics is the sampling policy's). A controller tracking the exact entropy is fed
    ``entropy_exact``, the same policy's mean exact token entropy at the same tokens, instead
    (``entropy_tracked`` in the metrics). ``on_step`` is called after every minibatch's
    optimizer step, taken or skipped (``optimizer_steps`` of them: a progress bar's count).
    ``guard`` counts the skipped steps in a row and stops the run, naming the loss term at
    fault, when there are too many (``entrogym.algos.step_guard``). Returns the iteration's
    metrics.
    """
    config = control.config
    stale = version is not None and batch.versions is not None
    stale = stale and bool((batch.versions < version).any())
    if stale and batch.old_logprobs is None:
        raise ValueError(
            "a stale batch (rows sampled by older versions) needs the sampling policy's "
            "old_logprobs; score them under the versions that sampled the rows"
        )
    reuse = batch.old_logprobs is None
    entropy = None if reuse or stale else sampled_entropy(batch.old_logprobs, batch.mask)
    sampler_entropy = None if reuse else sampled_entropy(batch.old_logprobs, batch.mask)
    current = torch.zeros(batch.mask.shape) if stale else None
    tally = _Tally()
    exact_tokens = float(batch.mask.sum())  # the tokens entropy_exact is the mean over
    if entropy is not None and control.tracks_exact:  # supplied old log-probs: no pass yet
        rows = torch.arange(len(batch))
        score_old_logprobs(batch, rows, score, micro_batch_size, micro_batch_tokens, tally, False)
    tracked = control.state_entropy if control.tracks_handed else None
    if control.tracks_handed and tracked is None:
        estimator = control.feedback.estimator
        raise ValueError(
            f"controller.estimator {estimator} is measured by the caller; hand it to "
            "EntropyControl.observe_states before the update"
        )
    if tracked is None and entropy is not None:
        tracked = _tracked(control, entropy, tally, exact_tokens)
    if tracked is not None:
        control.reference(tracked)
    # Clip-Cov draws tokens at random: its own stream, so the minibatch order is untouched.
    lever_generator = None if generator is None else torch.Generator()
    if lever_generator is not None:
        lever_generator.manual_seed(generator.initial_seed() + 1)
    for _ in range(config.epochs):
        for minibatch in minibatch_indices(len(batch), config.minibatch_size, generator):
            zero_grad()
            finite = accumulate_minibatch(
                control,
                batch,
                minibatch,
                score=score,
                backward=backward,
                micro_batch_size=micro_batch_size,
                tally=tally,
                micro_batch_tokens=micro_batch_tokens,
                reuse_scores=reuse,
                generator=lever_generator,
                current=current,
            )
            if reuse:  # every old log-prob is known before the first step
                rest = _other_rows(minibatch, len(batch))
                # entropy_exact only where the loss or the controller needs entropies: these
                # rows then pay one vocabulary-wide entropy pass more, GRPO nothing
                exact = tally if control.needs_entropy else None
                score_old_logprobs(batch, rest, score, micro_batch_size, micro_batch_tokens, exact)
                entropy = sampler_entropy = sampled_entropy(batch.old_logprobs, batch.mask)
                reuse = False
            if current is not None:  # the trained policy's scores, before its first step
                entropy = importance_weighted_entropy(
                    current[minibatch], batch.old_logprobs[minibatch], batch.mask[minibatch]
                )
                if not math.isfinite(entropy):  # a diverged score: the sampler's stands in
                    entropy = sampler_entropy
                exact_tokens = float(batch.mask[minibatch].sum())
                current = None
            if tracked is None:
                tracked = _tracked(control, entropy, tally, exact_tokens)
            if math.isfinite(tracked):
                control.reference(tracked)  # the target, before the first step's feedback
            stepped = step() if finite else False
            tally.count_step(stepped)
            if guard is not None:
                blame = functools.partial(
                    _blame, control, batch, minibatch, score, zero_grad, guard,
                    micro_batch_size, micro_batch_tokens,
                )  # fmt: skip
                guard.record(stepped, blame, from_gradients=finite)
            step_entropy = tally.pop_step_entropy()
            if finite and step_entropy is not None:
                control.observe_step(step_entropy)  # TRL's: the step's entropy, every step
            if on_step is not None:
                on_step()
    zero_grad()  # drops what a skipped last minibatch accumulated
    out: dict[str, float | None] = {
        **tally.summary(),
        "entropy": entropy,
        "entropy_sampler": sampler_entropy,
        "entropy_exact": tally.exact_entropy_mean(exact_tokens),
        "entropy_tracked": tracked,
        "reward_mean": float(batch.rewards.float().mean()),
        "zero_adv_groups": zero_advantage_groups(batch.trajectory_signal(), batch.group_ids),
        "optimizer_steps": tally.steps,
        "skipped_steps": tally.skipped,
        **dict.fromkeys(CONTROL_METRICS),
        **control.metrics(),
    }
    control.observe(tracked)
    out.update(control.target_metrics(tracked))
    return out


def _blame(
    control: EntropyControl,
    batch: UpdateBatch,
    minibatch: torch.Tensor,
    score: ScoreFn,
    zero_grad: ZeroGradFn,
    guard: StepGuard,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
) -> str:
    """The part of ``minibatch``'s loss that is not finite (:func:`blame_nonfinite`)."""

    def terms_of(index, logprobs, entropies):
        return loss_terms(control, batch.rows(index), logprobs, entropies)[0]

    return blame_nonfinite(
        list(batch.micro_batches(minibatch, micro_batch_size, micro_batch_tokens)),
        score,
        control.loss_needs_entropy,
        terms_of,
        zero_grad,
        guard.gradients_finite,
    )


def optimizer_steps(config: AlgorithmConfig, rows: int) -> int:
    """How many optimizer steps :func:`policy_update` takes (or skips) on ``rows`` rows: one
    per minibatch of every epoch."""
    return config.epochs * minibatch_count(rows, config.minibatch_size)


def _tracked(control: EntropyControl, sampled: float, tally: _Tally, tokens: float) -> float:
    """The entropy the controller tracks: the exact mean over ``tokens`` action tokens when it
    tracks the exact one (the sampled estimate stands in where a diverged score made it
    non-finite), else ``sampled``."""
    if not control.tracks_exact:
        return sampled
    exact = tally.exact_entropy_mean(tokens)
    if exact is None:  # a skipped micro-batch left tokens unscored: the step is skipped too
        return sampled
    return exact if math.isfinite(exact) else sampled
