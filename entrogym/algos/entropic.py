"""EntroPIC (Yang et al. 2025, arXiv:2511.15248): PI control of entropy through the weights of
positive- and negative-advantage tokens.

Positive-advantage tokens the policy already finds likely lower entropy; negative-advantage ones
raise it. EntroPIC moves a coefficient alpha by proportional-integral control on the entropy
error and reweights the two kinds of token with it: the paper's section "Method" (the PI law
for alpha^t and the reweighted policy loss) and the authors' code (``yk7333/EntroPIC``,
``compute_policy_loss_entropic`` and the PI update in ``dp_actor.py``). The stored copies of
the paper available here show its abstract and project page but not its numbered equations,
so the docstrings cite the section and the official code rather than equation numbers.

Sign. The paper's alpha is ``K_p (H - H*) + K_i sum (H - H*)``: positive when entropy is above
target, where it raises the weight of positive tokens. entrogym's levers need a coefficient
that raises entropy as it grows, so the ``entropic`` lever's coefficient ``alpha`` is the
paper's alpha negated: a likely token with advantage A gets weight ``1 - alpha`` when A > 0 and
``1 + alpha`` when A < 0.

Registered here: the ``entropic`` lever and the ``entropic`` controller (the paper's PI law).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from entrogym.algos.controller_params import check_gains
from entrogym.algos.controllers import Controller, ControllerParams, register_controller
from entrogym.algos.levers import Coefficient, Lever, LeverInputs, register_lever
from entrogym.algos.losses import TokenObjective


def entropic_adjustment(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    alpha: float,
    high_prob: float,
) -> torch.Tensor:
    """EntroPIC's per-token term added to the objective (to be maximised), ``[B, T]``:
    ``-alpha * r * |A|`` on action tokens whose current probability exceeds ``high_prob``
    (0: every action token), 0 elsewhere.

    Added to ``r * A`` it gives a likely token the weight ``1 - alpha`` when A > 0 and
    ``1 + alpha`` when A < 0 (section "Method"; official ``compute_policy_loss_entropic`` adds
    the paper's alpha times ``-r |A|`` over tokens with ``log pi > log 0.95`` to the loss, which
    is this term with alpha negated). The ratio is not clipped here, as in the official code.
    """
    likely = (logprobs.detach() > math.log(high_prob)) if high_prob > 0 else mask > 0
    return -alpha * ratio * advantages.abs() * (likely.to(ratio.dtype) * mask)


@dataclass(frozen=True)
class EntropicParams:
    """Knobs of the EntroPIC lever.

    Args:
        high_prob: only action tokens with current probability above this are reweighted (the
            official code's 0.95); 0 reweights every action token.
    """

    high_prob: float = 0.95

    def __post_init__(self) -> None:
        if not 0 <= self.high_prob < 1:
            raise ValueError(f"algo.lever.high_prob must be in [0, 1), got {self.high_prob}")


@register_lever("entropic")
class Entropic(Lever):
    """EntroPIC's reweighting of likely positive- and negative-advantage tokens
    (``entropic_adjustment``): weight ``1 - alpha`` for A > 0, ``1 + alpha`` for A < 0. alpha is
    the paper's coefficient negated (module doc), within [-1, 1] as the official clip, and
    moved by the paper's PI law (the ``entropic`` controller) after every optimizer step."""

    Params = EntropicParams
    coefficient = Coefficient("alpha", init=0.0, min=1e-3, max=1.0)
    default_controller = "entropic"
    # the official code moves alpha from every micro-batch's exact entropy, not once per iteration
    controller_knobs = {"entropic": {"step": "optimizer"}}

    def adjust_objective(
        self, terms: TokenObjective, inputs: LeverInputs, coef: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        alpha = float(coef or 0.0)
        extra = entropic_adjustment(
            terms.ratio, terms.advantages, inputs.logprobs, terms.mask, alpha,
            self.params.high_prob,
        )  # fmt: skip
        likely = (extra != 0).to(terms.mask.dtype) if alpha else terms.mask * 0
        share = float(likely.sum() / terms.mask.sum().clamp_min(1))
        return terms.objective + extra, {"entropic_share": share}


def entropic_alpha_step(
    entropy: float, target: float, integral: float, kp: float, ki: float, bound: float
) -> tuple[float, float]:
    """The EntroPIC PI law (section "Method"; official ``dp_actor.py``), in entrogym's sign:
    with e = H* - H in nats, ``alpha = clip(kp * e + ki * I, -bound, bound)`` where I is the sum
    of the errors of the earlier steps; returns (alpha, I + e). No anti-windup: the integral
    keeps summing while alpha is clipped, as in the official code (K_p 1, K_i 0.01, bound 1).
    """
    error = target - entropy
    alpha = float(np.clip(kp * error + ki * integral, -bound, bound))
    return alpha, integral + error


@dataclass(frozen=True)
class EntropicControllerParams(ControllerParams):
    """Knobs of EntroPIC's PI controller (and those every controller has).

    Args:
        kp: proportional gain on the entropy error H* - H, in nats (official K_p 1).
        ki: integral gain on the sum of the errors of the earlier steps (official K_i 0.01).
    """

    kp: float = 1.0
    ki: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gains(self)


@register_controller("entropic")
class EntropicController(Controller):
    """EntroPIC's PI law (``entropic_alpha_step``) on the absolute entropy error, alpha within
    [-max, max]. It is fed every optimizer step by default (the official code updates alpha per
    micro-batch from that micro-batch's exact entropy); here the step's alpha acts on the next
    minibatch, since the controller is fed after the step."""

    Params = EntropicControllerParams

    def __init__(self, params: EntropicControllerParams, coefficient: Coefficient, init: float):
        super().__init__(params, coefficient, init)
        self.integral = 0.0

    def bounds(self) -> tuple[float, float]:
        return -self._max(), self._max()

    def step(self, entropy: float, target: float) -> float:
        p = self.params
        alpha, self.integral = entropic_alpha_step(
            entropy, target, self.integral, p.kp, p.ki, self.high
        )
        return alpha

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "integral": self.integral}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.integral = state["integral"]
