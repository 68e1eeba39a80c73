"""Controllers: how a lever's coefficient moves toward the target entropy.

One class per controller, registered by name in ``CONTROLLERS`` with a typed ``Params``
dataclass that holds only the knobs it reads; each update rule is one named function citing its
source. ``fixed`` holds the coefficient at its ``init`` (:class:`FixedParams`) and has no
target. Every other controller shares :class:`ControllerParams`:

* the **target**: a ratio of the first observed entropy (``target_unit: ratio``; 1.0 is the
  paper's "entropy of the first iteration") or an absolute entropy in nats
  (``target_unit: nats``, TRL's ``entropy_target``);
* the **step**: once per iteration from the entropy of the iteration's experience
  (``step: iteration``, the paper's), or after every optimizer step from the exact mean token
  entropy of that step's minibatch under the policy before the step (``step: optimizer``,
  TRL's);
* the **estimator** of a batch's entropy: the mean exact token entropy -sum_v p log p over
  the batch's action tokens (``estimator: exact``), or the mean surprisal -log p of the
  sampled tokens there (``estimator: sampled``, the paper's); both estimate the same
  quantity, the exact one with less spread between batches;
* the coefficient's ``init``, ``min`` and ``max``; left unset they come from the lever
  (``entrogym.algos.lever_hooks.Coefficient``).

The shared knobs are ``entrogym.algos.controller_params.ControllerParams`` (imported here, where
each controller's own ``Params`` extends it); a controller of yours that subclasses
:class:`Controller` takes them unless it declares its own ``Params``.

Controllers: ``fixed`` (no feedback), ``paper`` (the appendix listing: double or halve, flip
the sign below ``min``), ``multiplicative`` (ADAPO's x1.05 / x0.95), ``additive`` (TRL's
+-delta, optionally applying the lever only while H <= target) and ``pi`` (proportional plus
integral action on the relative error, with anti-windup and a dead band).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from entrogym.algos.controller_params import ControllerParams, FixedParams, check_gains
from entrogym.algos.lever_hooks import Coefficient
from entrogym.algos.registry import Registry


class Controller:
    """The base of every controller: it starts the coefficient at ``init`` and, unless a
    subclass's ``step`` says otherwise, holds it there."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = ControllerParams

    def __init__(
        self, params: ControllerParams | FixedParams, coefficient: Coefficient, init: float
    ) -> None:
        self.params = params
        self.coefficient = coefficient
        self.low, self.high = self.bounds()
        self.value = float(params.init if params.init is not None else init)
        if not self.low <= self.value <= self.high:
            raise ValueError(
                f"algo.controller.init {self.value} is outside the coefficient's range "
                f"[{self.low}, {self.high}] ({coefficient.name}); set algo.controller.init, min or max"
            )
        self.last_entropy: float | None = None

    def bounds(self) -> tuple[float, float]:
        """``(low, high)`` the coefficient stays within."""
        return -math.inf, math.inf

    def applied(self) -> float:
        """The coefficient the lever uses now."""
        return self.value

    def update(self, entropy: float, target: float) -> None:
        """One step of feedback: ``entropy`` was measured, ``target`` is wanted."""
        self.last_entropy = entropy
        self.value = self.step(entropy, target)

    def step(self, entropy: float, target: float) -> float:
        """The next coefficient (the rule of this controller)."""
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value, self.last_entropy = state["value"], state.get("last_entropy")

    # Knob defaults from the lever: the controller's own knob wins where set.
    def _min(self) -> float:
        return self.coefficient.min if self.params.min is None else self.params.min

    def _max(self) -> float:
        return self.coefficient.max if self.params.max is None else self.params.max


CONTROLLERS: Registry = Registry("controller", base=Controller)
register_controller = CONTROLLERS.register


@register_controller("fixed")
class FixedController(Controller):
    """Holds the coefficient at ``init``: no feedback, so no target, step or estimator, and no
    range to keep (``FixedParams``)."""

    Params = FixedParams


def paper_zeta_step(
    zeta: float, entropy: float, target: float, zeta_min: float, zeta_max: float, factor: float
) -> float:
    """The bidirectional coefficient controller (appendix listing 'Adaptive controller').

    Entropy above target -> relax: halve a positive zeta, flipping to -zeta_min once it falls
    below zeta_min; double a negative one up to -zeta_max. Below target -> push: double a
    positive zeta up to zeta_max; halve a negative one, flipping to +zeta_min once its magnitude
    falls below zeta_min. Equal -> unchanged. ``factor`` is the listing's 2 (a factor f > 1
    multiplies and divides by f instead; f = 1 holds zeta where it is).
    """
    if entropy > target:
        if zeta >= 0:
            zeta /= factor
            if zeta < zeta_min:
                zeta = -zeta_min
        else:
            zeta = max(-zeta_max, zeta * factor)
    elif entropy < target:
        if zeta >= 0:
            zeta = min(zeta_max, zeta * factor)
        else:
            zeta /= factor
            if zeta > -zeta_min:
                zeta = zeta_min
    return zeta


@dataclass(frozen=True)
class PaperParams(ControllerParams):
    """Knobs of the paper's controller (and those every controller has).

    Args:
        factor: the multiplicative step per update: the listing's 2 (double / halve); a
            smaller factor (> 1) moves the coefficient more gently, 1 holds it.
    """

    factor: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.factor >= 1.0:
            raise ValueError(
                f"algo.controller.factor must be >= 1 (2 = the paper's doubling, 1 = fixed), "
                f"got {self.factor}"
            )


@register_controller("paper")
class PaperController(Controller):
    """The paper's adaptive controller (appendix listing), for REPO's zeta and the bonus's beta.

    It flips the coefficient's sign, so it needs a lever whose coefficient may be negative.
    """

    Params = PaperParams

    def bounds(self) -> tuple[float, float]:
        if not self.coefficient.signed:
            raise ValueError(
                f"controller paper flips the sign of the coefficient, and "
                f"{self.coefficient.name} cannot be negative; use multiplicative, additive, pi "
                "or fixed"
            )
        if not 0 < self._min() <= self._max():
            raise ValueError(
                f"controller paper needs 0 < min <= max, got min={self._min()}, max={self._max()}"
            )
        return -self._max(), self._max()

    def step(self, entropy: float, target: float) -> float:
        return paper_zeta_step(
            self.value, entropy, target, self._min(), self._max(), self.params.factor
        )


def adapo_eps_high_step(
    eps_high: float, entropy: float, target: float, lower: float, upper: float, up: float,
    down: float,
) -> float:  # fmt: skip
    """ADAPO's adaptive upper clip (paper Sec. 5, "ADAPO"): entropy below target -> eps_high <-
    min(up * eps_high, upper); above -> max(down * eps_high, lower); equal -> unchanged.
    Paper: start 0.28 in [0.2, 0.32], x1.05 / x0.95."""
    if entropy < target:
        return min(up * eps_high, upper)
    if entropy > target:
        return max(down * eps_high, lower)
    return eps_high


@dataclass(frozen=True)
class MultiplicativeParams(ControllerParams):
    """Knobs of the multiplicative controller (and those every controller has).

    Args:
        up: factor applied below the target.
        down: factor applied above the target.
    """

    up: float = 1.05
    down: float = 0.95

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.up >= 1:
            raise ValueError(f"algo.controller.up must be >= 1, got {self.up}")
        if not 0 < self.down <= 1:
            raise ValueError(f"algo.controller.down must be in (0, 1], got {self.down}")


@register_controller("multiplicative")
class MultiplicativeController(Controller):
    """ADAPO's controller: multiply by ``up`` below the target and by ``down`` above it, within
    [min, max] (the paper's eps_high rule)."""

    Params = MultiplicativeParams

    def bounds(self) -> tuple[float, float]:
        if not 0 < self._min() <= self._max():
            raise ValueError(
                f"controller multiplicative needs 0 < min <= max, got min={self._min()}, "
                f"max={self._max()}"
            )
        return self._min(), self._max()

    def step(self, entropy: float, target: float) -> float:
        p = self.params
        return adapo_eps_high_step(self.value, entropy, target, self.low, self.high, p.up, p.down)


def trl_additive_step(
    coef: float, entropy: float, target: float, delta: float, lower: float, upper: float
) -> float:
    """TRL's adaptive entropy coefficient (``GRPOTrainer``, ``use_adaptive_entropy``; from
    Skywork-OR1): entropy at or below the target -> coef <- min(coef + delta, upper); above ->
    max(coef - delta, lower)."""
    if entropy <= target:
        return min(coef + delta, upper)
    return max(coef - delta, lower)


@dataclass(frozen=True)
class AdditiveParams(ControllerParams):
    """Knobs of the additive controller (and those every controller has).

    Args:
        delta: the step added below the target and subtracted above it (TRL's
            ``entropy_coef_delta``, 0.005).
        gate: apply the lever only while the last measured entropy is at or below the target
            (TRL's semantics; before the first measurement the lever is off).
    """

    delta: float = 0.005
    gate: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.delta > 0:
            raise ValueError(f"algo.controller.delta must be > 0, got {self.delta}")


@register_controller("additive")
class AdditiveController(Controller):
    """TRL's adaptive entropy control: +-delta per update within [min, max], optionally gated."""

    Params = AdditiveParams

    def __init__(self, params: AdditiveParams, coefficient: Coefficient, init: float) -> None:
        super().__init__(params, coefficient, init)
        self.last_target: float | None = None

    def bounds(self) -> tuple[float, float]:
        return self._min(), self._max()

    def applied(self) -> float:
        if not self.params.gate:
            return self.value
        last, target = self.last_entropy, self.last_target
        return self.value if last is not None and last <= target else 0.0

    def update(self, entropy: float, target: float) -> None:
        self.last_target = target
        super().update(entropy, target)

    def step(self, entropy: float, target: float) -> float:
        return trl_additive_step(
            self.value, entropy, target, self.params.delta, self.low, self.high
        )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "last_target": self.last_target}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.last_target = state.get("last_target")


def relative_error(entropy: float, target: float, deadband: float = 0.0) -> float:
    """(target - H) / target, with errors inside +-deadband counted as 0 and the band
    subtracted outside it (so the error is continuous at the band's edges)."""
    error = (target - entropy) / target
    if abs(error) <= deadband:
        return 0.0
    return error - math.copysign(deadband, error)


def pi_output(init: float, scale: float, kp: float, ki: float, error: float, integral: float):
    """The PI law: coefficient = init + scale * (kp * e + ki * sum of e). ``scale`` (the
    controller's ``max``) makes the gains dimensionless: kp = 1 moves the coefficient by its
    whole range for a 100 % error."""
    return init + scale * (kp * error + ki * integral)


@dataclass(frozen=True)
class PIParams(ControllerParams):
    """Knobs of the PI controller (and those every controller has).

    Args:
        kp: proportional gain on the relative error (target - H) / target, in units of max.
        ki: integral gain on the sum of relative errors, in units of max per update.
        deadband: relative errors within +-deadband count as 0 (no action near the target).
    """

    kp: float = 0.3
    ki: float = 0.1
    deadband: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gains(self)
        if not 0 <= self.deadband < 1:
            raise ValueError(f"algo.controller.deadband must be in [0, 1), got {self.deadband}")


@register_controller("pi")
class PIController(Controller):
    """Proportional plus integral action on the relative entropy error.

    The coefficient is ``init + max * (kp e + ki sum e)`` clamped to [min, max]; it may change
    sign where the lever allows (min defaults to -max then). Anti-windup by back-calculation:
    when the output saturates, the integral is set to the value that puts the output exactly
    at the bound, so it leaves the bound as soon as the error turns.
    """

    Params = PIParams

    def __init__(self, params: PIParams, coefficient: Coefficient, init: float) -> None:
        super().__init__(params, coefficient, init)
        self.start = self.value
        self.integral = 0.0

    def bounds(self) -> tuple[float, float]:
        high = self._max()
        if self.params.min is not None:
            low = self.params.min
        else:
            low = -high if self.coefficient.signed else self.coefficient.min
        return low, high

    def step(self, entropy: float, target: float) -> float:
        p = self.params
        error = relative_error(entropy, target, p.deadband)
        self.integral += error
        raw = pi_output(self.start, self.high, p.kp, p.ki, error, self.integral)
        value = min(max(raw, self.low), self.high)
        if value != raw and p.ki > 0:  # back-calculate the integral onto the bound
            self.integral = ((value - self.start) / self.high - p.kp * error) / p.ki
        return value

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "start": self.start, "integral": self.integral}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.start, self.integral = state["start"], state["integral"]
