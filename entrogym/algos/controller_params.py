"""The knobs of a controller: ``FixedParams`` (the ``fixed`` controller's one knob, its value)
and ``ControllerParams``, shared by every controller that moves toward a target (the target,
the step, the estimator of a batch's entropy and the coefficient's range);
``entrogym.algos.controllers`` explains them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TargetUnit = Literal["ratio", "nats"]
StepEvery = Literal["iteration", "optimizer"]
Estimator = Literal["exact", "sampled", "probe", "relative", "input_dependence"]


@dataclass(frozen=True)
class FixedParams:
    """Knobs of the ``fixed`` controller: it holds the coefficient where it starts and has no
    target, so it takes nothing else.

    Args:
        init: the coefficient (unset: the lever's start value).
    """

    init: float | None = None


@dataclass(frozen=True)
class ControllerParams:
    """Knobs every controller that moves toward a target has.

    Args:
        target: the target entropy: a ratio of the first observed entropy, or nats (see
            target_unit).
        target_unit: ``ratio`` (of the first observed entropy; the paper's target is 1.0) or
            ``nats`` (an absolute target, as TRL's).
        target_iterations: a ratio target is taken from the mean entropy of this many first
            iterations (1: the first iteration's, the paper's). A small batch's entropy varies
            by several percent between batches of one fixed policy (docs/demo.md), so a
            one-batch reference can be off by more than the band a run is asked to hold;
            until the target is known the controller does not move.
        target_probe: a ratio target also averages this many extra batches, sampled from the
            initial policy before the first update only to measure it (the trainer draws them
            from the training split, as an iteration draws its tasks, and trains on none of
            them): a target measured before any push, on more samples than one batch.
        step: ``iteration`` (once per iteration, the paper's) or ``optimizer`` (after every
            optimizer step, TRL's).
        estimator: what the controller tracks of a batch (and what its target is measured
            in): ``exact``, the mean over the batch's action tokens of the exact entropy
            -sum_v p(v) log p(v) at each sampled position (the scorer computes it, one
            vocabulary-wide pass more where nothing else needs it), or ``sampled``, the mean
            of -log p(sampled token) there (the paper's; free, unbiased, noisier: it adds the
            spread of drawing one token at each position). A controller fed every optimizer
            step reads the minibatch's exact entropy either way; the estimator then sets its
            target's. ``probe``: the exact entropy of the policy being trained on fixed
            states, the ``target_probe`` batches drawn from the initial policy, rescored
            before every iteration's update. A batch's mean moves with which prompts were
            drawn (8-10 % for a fixed SmolLM2 policy at 4 tasks x 4); on fixed states only
            the policy's change moves it. Needs ``target_probe`` >= 1 and ``step iteration``.
            ``relative``: the exact entropy of the policy being trained on the iteration's own
            batch over the base model's (the adapter switched off) on the same tokens
            (``entrogym.algos.entropy.relative_entropy``), measured before the update: a ratio,
            1 where the policy is as uncertain as the base model on the states it now visits.
            The prompts drawn move both terms together, so it spreads less than ``exact``, and
            it is measured on the states the lever pushes, which ``probe``'s fixed states stop
            being once the policy moves away from them. Its target is ``target`` times the
            first iteration's ratio (1.0 for a fresh adapter). Needs ``step iteration``.
            ``input_dependence``: not an entropy but how much the responses depend on the task,
            the mutual information I(X; Y) between fixed probe tasks and the policy's responses
            to them (``entrogym.algos.input_dependence``), measured by the trainer before every
            update. The lever still pushes entropy: the coefficient rises while I is below its
            target, which restores I only where more entropy brings more input dependence (a
            policy can be diverse and input-agnostic at once). Needs ``step iteration``, no
            ``target_probe`` (it measures entropy) and a lever that reads no entropy target in
            its loss.
        init: the coefficient's start value (unset: the lever's).
        min: the coefficient's lower bound, or for the paper controller the smallest magnitude
            before its sign flips (unset: the lever's; pi: -max for a lever that may go negative).
        max: the coefficient's upper bound (its largest magnitude for a signed one; unset: the
            lever's).
    """

    target: float = 1.0
    target_unit: TargetUnit = "ratio"
    target_iterations: int = 1
    target_probe: int = 0
    step: StepEvery = "iteration"
    estimator: Estimator = "exact"
    init: float | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise ValueError(f"algo.controller.target must be > 0, got {self.target}")
        if self.target_unit not in ("ratio", "nats"):
            raise ValueError(
                f"algo.controller.target_unit must be ratio or nats, got {self.target_unit!r}"
            )
        if isinstance(self.target_iterations, bool) or not (
            isinstance(self.target_iterations, int) and self.target_iterations >= 1
        ):
            raise ValueError(
                f"algo.controller.target_iterations must be an integer >= 1, "
                f"got {self.target_iterations!r}"
            )
        if isinstance(self.target_probe, bool) or not (
            isinstance(self.target_probe, int) and self.target_probe >= 0
        ):
            raise ValueError(
                f"algo.controller.target_probe must be an integer >= 0, got {self.target_probe!r}"
            )
        if self.target_unit == "nats" and (self.target_probe or self.target_iterations != 1):
            knob = "target_probe" if self.target_probe else "target_iterations"
            raise ValueError(
                f"algo.controller.{knob} measures a ratio target, and target_unit nats sets an "
                f"absolute one; drop {knob} or use target_unit ratio"
            )
        if self.step not in ("iteration", "optimizer"):
            raise ValueError(
                f"algo.controller.step must be iteration or optimizer, got {self.step!r}"
            )
        if self.estimator not in ("exact", "sampled", "probe", "relative", "input_dependence"):
            raise ValueError(
                "algo.controller.estimator must be exact, sampled, probe, relative or "
                f"input_dependence, got {self.estimator!r}"
            )
        if self.estimator in ("relative", "input_dependence") and self.step != "iteration":
            raise ValueError(
                f"algo.controller.estimator {self.estimator} is measured once per iteration, "
                "before the update; set algo.controller.step iteration"
            )
        if self.estimator == "input_dependence" and self.target_probe:
            raise ValueError(
                "algo.controller.target_probe measures the initial policy's entropy, and "
                "estimator input_dependence tracks the mutual information; drop target_probe "
                "(target_iterations averages the first iterations' instead)"
            )
        if self.estimator == "probe" and (not self.target_probe or self.step != "iteration"):
            fix = "target_probe 1 or more" if not self.target_probe else "step iteration"
            raise ValueError(
                "algo.controller.estimator probe rescores the target probe's batches once per "
                f"iteration; set algo.controller.{fix}"
            )
        if self.max is not None and not self.max > 0:
            raise ValueError(f"algo.controller.max must be > 0, got {self.max}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(
                f"algo.controller.min must be <= algo.controller.max, got {self.min} > {self.max}"
            )


def check_gains(params: ControllerParams) -> None:
    """A PI controller's ``kp`` and ``ki`` are each >= 0; the message names the one that is not
    and quotes only its value (the other may still change, e.g. to a lever's suggestion)."""
    for knob in ("kp", "ki"):
        value = getattr(params, knob)
        if not value >= 0:
            raise ValueError(f"algo.controller.{knob} must be >= 0, got {value}")
