"""The built-in entropy levers: how an algorithm pushes the policy's entropy, through one
coefficient. ``entrogym.algos.lever_hooks`` defines what a lever declares, the hooks it may
override and how the target reaches it; ``entrogym.algos.entropic`` and
``entrogym.algos.aepo`` hold EntroPIC's and AEPO's.

Adding one is a class plus a decorator line; ``examples/custom_entropy_control.py`` writes one
and trains with it through ``entrogym train --algo.lever module:name``::

    @register_lever("my-bonus")
    class MyBonus(Lever):
        coefficient = Coefficient("beta", init=0.01, min=1e-3, max=1.0)

        def extra_loss(self, logprobs, entropies, mask, coef, *, advantages=None, target=None):
            return coef * (logprobs.detach() * logprobs * mask).sum() / mask.sum()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from entrogym.algos.entropy import (
    centred_logprobs,
    centred_repo_d,
    clip_cov_tokens,
    entropy_bonus_loss,
    entropy_constraint_loss,
    entropy_constraint_push_loss,
    entropy_neutral_zeta,
    kl_cov_penalty,
    kl_cov_tokens,
    repo_d,
    repo_r,
    token_covariance,
)
from entrogym.algos.finite import ALLOWS_INF
from entrogym.algos.lever_hooks import (
    LEVERS,
    Coefficient,
    Lever,
    LeverInputs,
    register_lever,
)
from entrogym.algos.losses import ClipParams, TokenObjective

# The protocol's names, importable from here as well (this module registers the levers).
__all__ = ["LEVERS", "Coefficient", "Lever", "LeverInputs", "register_lever"]


@dataclass(frozen=True)
class RepoParams:
    """Knobs of REPO's levers.

    Args:
        centering: the shaping log-prob: ``raw`` log pi (the paper's implementation) or
            ``exact`` log pi + H(s) with the exact per-token entropy (Sec. 5), which makes the
            scorer compute entropies.
    """

    centering: Literal["raw", "exact"] = "raw"

    def __post_init__(self) -> None:
        if self.centering not in ("raw", "exact"):
            raise ValueError(f"algo.lever.centering must be raw or exact, got {self.centering!r}")


class RepoLever(Lever):
    """REPO's per-token shaping with raw log pi or, with ``centering: exact``, log pi + H(s)."""

    Params = RepoParams
    # The per-token formula (entrogym.algos.entropy.repo_r or repo_d): (A, logp, zeta) -> A'.
    formula: ClassVar[Any]

    @property
    def needs_entropy(self) -> bool:
        # Only the exact form needs H(s); raw REPO keeps the scorer's cheap path.
        return self.params.centering == "exact"

    def shape_advantages(
        self,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        coef: float | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.needs_entropy:
            shaping = logprobs.detach()
        elif entropies is None:
            raise ValueError(
                "lever.centering='exact' needs the scorer's exact per-token entropies; the "
                "score function must return them when asked (need_entropy=True)"
            )
        else:
            shaping = centred_logprobs(logprobs, entropies)
        return type(self).formula(advantages, shaping, coef)


@register_lever("repo-r")
class RepoR(RepoLever):
    """REPO-R: multiplicative per-token reshaping of the advantages (appendix "REPO-R")."""

    coefficient = Coefficient("zeta", init=1e-3, min=1e-4, max=0.05)
    # 0.05 is the paper's cap for its doubling rule; pi needs room above it (REPO-R saturates
    # there when the lr is low) and, as REPO-R moves entropy less per unit zeta than REPO-D,
    # stronger gains: the regime map's best on the bandit (docs/bandit.md).
    controller_knobs = {"pi": {"kp": 1.0, "ki": 1.0, "max": 2.0}}
    formula = staticmethod(repo_r)


@register_lever("repo-d")
class RepoD(RepoLever):
    """REPO-D: A - zeta * logp per token (Sec. 5)."""

    coefficient = Coefficient("zeta", init=1e-3, min=1e-3, max=10.0)
    formula = staticmethod(repo_d)


@register_lever("cov-neutral")
class CovNeutral(Lever):
    """REPO-D around the entropy-neutral coefficient: A - (zeta* + zeta)(log pi - mean log pi)
    per token. zeta* (``entropy_neutral_zeta``) cancels the batch's first-order entropy change
    (Cor. 1), recomputed for every micro-batch; zeta, the controller's coefficient, moves the
    entropy toward the target from there.

    The driver of collapse is the covariance of log pi and A; this lever removes its
    estimate before the step, so feedback only has to correct what the first-order
    prediction misses. ``zeta_neutral`` in the metrics is zeta*'s mean over micro-batches.
    """

    coefficient = Coefficient("zeta", init=0.0, min=1e-3, max=0.2)
    default_controller = "pi"
    controller_knobs = {"paper": {"init": 1e-3}}  # paper's doubling cannot leave 0

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        self._neutral = 0.0  # this micro-batch's zeta*, reported by adjust_objective

    def shape_advantages(
        self,
        advantages: torch.Tensor,
        logprobs: torch.Tensor,
        entropies: torch.Tensor | None,
        coef: float | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if mask is None:
            raise ValueError("lever cov-neutral needs the action mask of the log-probs")
        self._neutral = entropy_neutral_zeta(advantages, logprobs, mask)
        return centred_repo_d(advantages, logprobs, mask, self._neutral + float(coef or 0.0))

    def adjust_objective(
        self, terms: TokenObjective, inputs: LeverInputs, coef: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return terms.objective, {"zeta_neutral": self._neutral}


@register_lever("entropy-bonus")
class EntropyBonus(Lever):
    """J + beta * H with exact token entropies (Sec. 5, opening). beta takes REPO-D's range:
    the appendix shows REPO-D equals an entropy bonus with that coefficient."""

    coefficient = Coefficient("beta", init=1e-3, min=1e-3, max=10.0)

    @property
    def needs_entropy(self) -> bool:
        return True

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
        if entropies is None:
            raise ValueError(f"the {self.name} lever needs score() to return entropies")
        return entropy_bonus_loss(entropies, mask, coef)


@dataclass(frozen=True)
class EntropyConstraintParams:
    """Knobs of the entropy-constraint lever.

    Args:
        penalty: the augmented Lagrangian's quadratic weight mu: the in-loss push is an entropy
            bonus of mu * (H* - H) / H* from the micro-batch's own entropy H (0.2: a 25 %
            shortfall adds 0.05 to beta).
        upper_slack: the relative excess over the target the penalty tolerates before it pulls
            the entropy down (0: a two-sided constraint; inf: one-sided, H >= H*).
        rows: where the push acts: ``all`` action tokens, or ``mixed``: only the tokens of rows
            whose advantage is not 0 (groups with unequal rewards, where the policy gradient
            acts), so a group the policy already solves is left alone; the constraint's error
            is still measured on every token.
    """

    penalty: float = 0.2
    upper_slack: float = field(default=0.0, metadata=ALLOWS_INF)
    rows: Literal["all", "mixed"] = "all"

    def __post_init__(self) -> None:
        if not self.penalty >= 0:
            raise ValueError(f"algo.lever.penalty must be >= 0, got {self.penalty}")
        if not self.upper_slack >= 0:
            raise ValueError(
                f"algo.lever.upper_slack must be >= 0 (inf: never pull down), got {self.upper_slack}"
            )
        if self.rows not in ("all", "mixed"):
            raise ValueError(f"algo.lever.rows must be all or mixed, got {self.rows!r}")


@register_lever("entropy-constraint")
class EntropyConstraint(EntropyBonus):
    """The constraint H = H* by the method of multipliers (``entropy_constraint_loss``):
    beta, the controller's coefficient, is the multiplier (dual ascent is the ``pi``
    controller's integral action); ``penalty`` adds a proportional push computed inside the
    loss from each micro-batch's exact entropy, so it needs no feedback step and does not lag.
    Before the target is known (the first minibatch of the first iteration) it is the entropy
    bonus with coefficient beta.
    """

    Params = EntropyConstraintParams
    coefficient = Coefficient("beta", init=0.0, min=1e-3, max=0.1)
    reads_target = True
    default_controller = "pi"
    # pi as dual ascent: integral action only (the penalty is the proportional part), fed the
    # exact entropy of every minibatch; paper's doubling cannot leave 0.
    controller_knobs = {"pi": {"kp": 0.0, "ki": 0.5, "step": "optimizer"}, "paper": {"init": 1e-3}}

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
        beta = float(coef or 0.0)
        if target is None or entropies is None:
            return super().extra_loss(logprobs, entropies, mask, beta)
        p = self.params
        if p.rows == "all" or advantages is None:
            return entropy_constraint_loss(entropies, mask, beta, target, p.penalty, p.upper_slack)
        moved = advantages != 0
        moved = moved.any(dim=1) if moved.dim() == 2 else moved
        push = mask * moved[:, None].to(mask.dtype)
        return entropy_constraint_push_loss(
            entropies, mask, push, beta, target, p.penalty, p.upper_slack
        )


@register_lever("clip-high")
class ClipHigh(Lever):
    """ADAPO's lever: the loss's upper clip eps_high (Sec. 5, "ADAPO"); a wider upper clip lets
    rare tokens with positive advantage gain more, which raises entropy. It starts at the
    loss's ``eps_high``; the paper moves it within [0.2, 0.32]."""

    coefficient = Coefficient("eps_high", init=0.28, min=0.2, max=0.32, signed=False)
    default_controller = "multiplicative"

    def initial_coefficient(self, loss: ClipParams) -> float:
        if loss.eps_high is None:
            raise ValueError(
                "lever clip-high steers the upper clip, so loss.eps_high cannot be None"
            )
        return loss.eps_high

    def clip_range(
        self, eps_low: float | None, eps_high: float | None, coef: float | None
    ) -> tuple[float | None, float | None]:
        return eps_low, coef


@dataclass(frozen=True)
class ClipCovParams:
    """Knobs of Clip-Cov (verl's ``policy_loss.clip_cov_*`` and defaults).

    Args:
        lb: lower bound of the covariance band a token must fall in.
        ub: upper bound of that band.
    """

    lb: float = 1.0
    ub: float = 5.0

    def __post_init__(self) -> None:
        if not self.lb < self.ub:
            raise ValueError(f"algo.lever.lb must be < algo.lever.ub, got {self.lb} and {self.ub}")


@register_lever("clip-cov")
class ClipCov(Lever):
    """Clip-Cov (Cui et al. 2025; verl ``compute_policy_loss_clip_cov``): detach the gradient of
    a random ``clip_cov_ratio`` share of the action tokens whose advantage-log-prob covariance
    lies in (lb, ub) and that the PPO clip has not clipped. The coefficient is that share
    (verl's default 2e-4); 0 turns the lever off."""

    Params = ClipCovParams
    coefficient = Coefficient("clip_cov_ratio", init=2e-4, min=0.0, max=1.0, signed=False)
    default_controller = "fixed"

    def adjust_objective(
        self, terms: TokenObjective, inputs: LeverInputs, coef: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cov = token_covariance(terms.advantages, inputs.logprobs, terms.mask)
        chosen = clip_cov_tokens(
            cov, terms.mask, terms.clipped, coef or 0.0, self.params.lb, self.params.ub,
            inputs.generator,
        )  # fmt: skip
        corr = (~chosen).to(terms.objective.dtype)  # verl's `corr`: 0 on the chosen tokens
        return terms.objective * corr, {"clip_cov_share": _share(chosen, terms.mask)}


@dataclass(frozen=True)
class KlCovParams:
    """Knobs of KL-Cov (verl's ``policy_loss.kl_cov_ratio`` and default).

    Args:
        kl_cov_ratio: share of the action tokens, those with the largest covariance, that get
            the KL penalty.
    """

    kl_cov_ratio: float = 2e-4

    def __post_init__(self) -> None:
        if not 0 < self.kl_cov_ratio <= 1:
            raise ValueError(f"algo.lever.kl_cov_ratio must be in (0, 1], got {self.kl_cov_ratio}")


@register_lever("kl-cov")
class KlCov(Lever):
    """KL-Cov (Cui et al. 2025; verl ``compute_policy_loss_kl_cov``): subtract kl_coef * |log pi
    - log pi_old| from the objective of the ``kl_cov_ratio`` share of action tokens with the
    largest covariance. The coefficient is kl_coef (verl's ``ppo_kl_coef``, default 1); 0 turns
    the lever off. verl applies no PPO clip in this mode: the ``kl-cov`` preset sets none."""

    Params = KlCovParams
    coefficient = Coefficient("kl_coef", init=1.0, min=0.0, max=10.0, signed=False)
    default_controller = "fixed"

    def adjust_objective(
        self, terms: TokenObjective, inputs: LeverInputs, coef: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        if not coef:
            return terms.objective, {"kl_cov_share": 0.0}
        cov = token_covariance(terms.advantages, inputs.logprobs, terms.mask)
        chosen = kl_cov_tokens(cov, terms.mask, self.params.kl_cov_ratio)
        penalty = kl_cov_penalty(inputs.logprobs, inputs.old_logprobs, chosen, coef)
        return terms.objective - penalty, {"kl_cov_share": _share(chosen, terms.mask)}


def _share(chosen: torch.Tensor, mask: torch.Tensor) -> float:
    return float(chosen.sum() / (mask > 0).sum().clamp_min(1))
