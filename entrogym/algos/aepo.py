"""AEPO (Wang et al. 2025, "Arbitrary Entropy Policy Optimization", arXiv:2510.08141): a
REINFORCE term on samples drawn at another temperature replaces the entropy bonus.

Each iteration draws extra samples from the temperature-adjusted policy pi^T (logits / T) and
adds ``alpha * E_{o ~ pi^T}[R(q, o) grad log pi(o | q)]`` to the policy gradient, the log-probs
taken under the current policy at temperature 1. Samples from a flatter pi^T (T > 1) pull the
policy toward a flatter distribution, a sharper one (T < 1) toward a sharper one; the
temperature is T_high while the entropy is below the target and T_low otherwise (paper Sec. 4
"Method"; the repository's README "Method Overview" states both rules; official code
``597358816/AEPO``, ``RayPPOTrainer.fit``). The stored copies of the paper available here show
its abstract, not its numbered equations, so the docstrings cite the section and the code.

Registered here: the ``aepo`` lever (coefficient: the temperature; a larger T means more
entropy) and the ``aepo`` controller (the paper's switch). The samples come from the caller:
before each iteration's update it draws them at ``control.coefficient`` and hands them to the
lever with :meth:`Aepo.attach` (the bandit lab, ``entrogym.theory.temperature``, and the LLM
trainer, ``ControlFeed`` in ``entrogym.train.control_feed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from entrogym.algos.checks import as_float_tensor
from entrogym.algos.controllers import Controller, register_controller
from entrogym.algos.levers import Coefficient, Lever, register_lever


def aepo_reinforce_loss(
    logprobs: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor, alpha: float
) -> torch.Tensor:
    """AEPO's regularizer as a loss: ``-alpha * sum_i R_i sum_t log pi(o_it) / sum mask``, over
    samples o_i drawn from pi^T and scored (``logprobs [n, w]``, with gradients) by the current
    policy at temperature 1. Its gradient is -alpha times the token-mean REINFORCE estimate of
    ``E_{o ~ pi^T}[R(q, o) grad log pi(o | q)]`` (Sec. 4; README "Method Overview"), with no
    baseline, as the paper writes it. ``rewards [n]`` are R(q, o): the official code keeps the
    samples with a positive group advantage and sets their weight to 1, which callers get by
    passing that 0/1 selection as ``rewards``.
    """
    if logprobs.dim() != 2 or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs and mask must be [n, w] of one shape, got {tuple(logprobs.shape)} and "
            f"{tuple(mask.shape)}"
        )
    rewards = as_float_tensor("rewards", rewards)
    if rewards.shape != logprobs.shape[:1]:
        raise ValueError(f"rewards must be [n] = [{logprobs.shape[0]}], got {tuple(rewards.shape)}")
    mask = mask.to(logprobs.dtype)
    weighted = rewards.to(logprobs.dtype)[:, None] * logprobs * mask
    return -alpha * weighted.sum() / mask.sum().clamp_min(1)


def aepo_temperature_step(entropy: float, target: float, t_low: float, t_high: float) -> float:
    """AEPO's temperature rule (Sec. 4; README "Method Overview"): T_high if the entropy of the
    policy that sampled is below the target, T_low otherwise (official defaults 1.2 and 0.8)."""
    return t_high if entropy < target else t_low


@dataclass
class TemperatureSamples:
    """One iteration's samples at temperature T, as the caller hands them to the ``aepo`` lever.

    Args:
        rewards: R(q, o) of each sample, ``[n]``.
        mask: its action tokens, ``[n, w]``.
        score: returns the samples' log-probs under the current policy at temperature 1,
            ``[n, w]`` with gradients; called once per micro-batch, so each optimizer step
            sees the policy as it is then.
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    score: Callable[[], torch.Tensor]


@dataclass(frozen=True)
class AepoParams:
    """Knobs of the AEPO lever.

    Args:
        alpha: the REINFORCE term's weight against the policy loss.
        share: the share of an iteration's prompts that the caller samples again at T (each with
            the iteration's group size; the official code's 1/4).
    """

    alpha: float = 1.0
    share: float = 0.25

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"algo.lever.alpha must be >= 0, got {self.alpha}")
        if not 0 < self.share <= 1:
            raise ValueError(f"algo.lever.share must be in (0, 1], got {self.share}")


@register_lever("aepo")
class Aepo(Lever):
    """AEPO: adds ``aepo_reinforce_loss`` on the samples the caller drew at temperature T (the
    coefficient) to every minibatch's loss. A caller that draws none gets an error at the first
    loss."""

    Params = AepoParams
    coefficient = Coefficient("temperature", init=1.2, min=0.8, max=1.2, signed=False)
    default_controller = "aepo"

    def __init__(self, params: AepoParams) -> None:
        super().__init__(params)
        self.samples: TemperatureSamples | None = None

    def attach(self, samples: TemperatureSamples) -> None:
        """This iteration's samples at the temperature ``control.coefficient`` gave."""
        self.samples = samples

    def extra_loss(
        self,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        mask: torch.Tensor,
        coef: float | None,
        *,
        advantages: torch.Tensor | None = None,
        target: float | None = None,
    ) -> torch.Tensor:
        if self.samples is None:
            raise ValueError(
                "lever aepo needs samples drawn at its temperature each iteration, "
                "attached with Aepo.attach before the update; none were"
            )
        s = self.samples
        return aepo_reinforce_loss(s.score(), s.rewards, s.mask, self.params.alpha)


@register_controller("aepo")
class AepoController(Controller):
    """AEPO's switch (``aepo_temperature_step``): T = max (T_high) below the target, min (T_low)
    at or above it. It starts at max, as the official loop (its entropy starts at 0)."""

    def bounds(self) -> tuple[float, float]:
        if not 0 < self._min() <= self._max():
            raise ValueError(
                f"controller aepo needs 0 < min (T_low) <= max (T_high), got min={self._min()}, "
                f"max={self._max()}"
            )
        return self._min(), self._max()

    def step(self, entropy: float, target: float) -> float:
        return aepo_temperature_step(entropy, target, self.low, self.high)
