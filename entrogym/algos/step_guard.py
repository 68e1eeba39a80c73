"""Non-finite optimizer steps: skipped, counted, and a run of them stopped with its culprit named.

A step whose loss or gradients are NaN or inf must not reach the weights: one such step turns
the whole adapter into NaN. The caller's ``step()`` skips a step with non-finite gradients
(whatever the dtype; fp16's loss scaler is only one reason) and :func:`policy_update` skips one
whose scores or loss were non-finite; both are counted (``skipped_steps``). A few in a row are
no passing overflow: :class:`StepGuard` then stops the run, and :func:`blame_nonfinite` names
the part that produced them by scoring the minibatch again term by term (only then: it costs a
forward and a backward pass per loss term).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Steps in a row with non-finite scores, losses or gradients that stop a run (docs/runs.md).
DEFAULT_MAX_BAD_STEPS_IN_ROW = 3


class NonFiniteSteps(ArithmeticError):
    """``limit`` optimizer steps in a row were skipped for non-finite values; the message names
    the part that produced them and what to do."""


@dataclass
class StepGuard:
    """Counts skipped steps in a row across iterations; the ``limit``-th stops the run.

    ``gradients_finite()`` says whether the gradients accumulated now are all finite (the blame
    uses it); ``overflow_expected()`` whether the last skipped step was a loss-scale overflow,
    which the scaler answers by itself (fp16 while its scale is above 1): not counted."""

    limit: int = DEFAULT_MAX_BAD_STEPS_IN_ROW
    gradients_finite: Callable[[], bool] | None = None
    overflow_expected: Callable[[], bool] = lambda: False
    streak: int = 0

    def record(self, stepped: bool, blame: Callable[[], str], from_gradients: bool) -> None:
        """One optimizer step, taken or skipped (``from_gradients``: skipped by ``step()``)."""
        if stepped:
            self.streak = 0
            return
        if from_gradients and self.overflow_expected():
            return
        self.streak += 1
        if self.limit and self.streak >= self.limit:
            raise NonFiniteSteps(
                f"{self.streak} optimizer steps in a row were skipped: {blame()} were not "
                "finite; the weights are those from before them. Fix that part (if it is the "
                "model's own: lower --lr, or use --dtype fp32)"
            )


def blame_nonfinite(
    micro_batches: list[torch.Tensor],
    score: Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]],
    need_entropy: bool,
    terms_of: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], dict[str, torch.Tensor]],
    zero_grad: Callable[[], None],
    gradients_finite: Callable[[], bool] | None,
) -> str:
    """Which part of a minibatch's loss is not finite, found by scoring its micro-batches again
    (the weights are those of the skipped step): the scores, then each term's value
    (``terms_of(index, logprobs, entropies)`` -> name -> scalar), then each term's gradient on
    its own. Leaves no gradient behind."""
    try:
        with torch.enable_grad():
            for index in micro_batches:
                logprobs, entropies = score(index, need_entropy)
                if not bool(torch.isfinite(logprobs.detach()).all()):
                    return "the policy's log-probs (the model's forward pass)"
                terms = terms_of(index, logprobs, entropies)
                for name, value in terms.items():
                    if not bool(torch.isfinite(value.detach())):
                        return f"the value of {name}"
                if gradients_finite is None:
                    continue
                for name, value in terms.items():
                    zero_grad()
                    value.backward(retain_graph=True)
                    if not gradients_finite():
                        return f"the gradients of {name}"
    finally:
        zero_grad()
    return "the gradients (of no single loss term on its own: the sum's, or the backward pass's)"
