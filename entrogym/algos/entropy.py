"""Entropy estimation and explicit entropy control (paper Sec. 5 and appendix listings).

REPO-R / REPO-D reshape advantages per token with the latest policy's detached log-probs;
ZetaController and EpsHighController are the once-per-iteration feedback loops that steer the
policy entropy toward the target (the entropy over the first iteration's experience).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from entrogym.algos.checks import as_float_tensor


def _broadcast_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    advantages = as_float_tensor("advantages", advantages)
    if advantages.shape == logprobs.shape:
        return advantages
    if advantages.dim() == 1 and logprobs.dim() == 2 and advantages.shape[0] == logprobs.shape[0]:
        return advantages[:, None].expand_as(logprobs)
    raise ValueError(
        f"advantages shape {tuple(advantages.shape)} must be [B] or equal to logprobs "
        f"shape {tuple(logprobs.shape)}"
    )


def repo_r(advantages: torch.Tensor, logprobs: torch.Tensor, zeta: float) -> torch.Tensor:
    """REPO-R per-token advantage (appendix "REPO-R: Derivation", 'Bidirectional REPO-R' listing).

    A > 0: A * (1 - zeta * logp), clamped at >= 0.   A < 0: A * (1 + zeta * logp), clamped at <= 0.
    A == 0: unchanged. ``logp`` is the latest policy's log-prob of the sampled token, detached
    (raw as in the paper's implementation, or ``centred_logprobs`` with ``repo_centering:
    exact``). For zeta > 0 this boosts rare correct
    tokens and softens the penalty on rare wrong ones (entropy up); zeta < 0 does the reverse.
    """
    logp = as_float_tensor("logprobs", logprobs).detach()
    adv = _broadcast_advantages(advantages, logp)
    positive = (adv * (1 - zeta * logp)).clamp_min(0.0)
    negative = (adv * (1 + zeta * logp)).clamp_max(0.0)
    return torch.where(adv > 0, positive, torch.where(adv < 0, negative, adv))


def centred_logprobs(logprobs: torch.Tensor, token_entropies: torch.Tensor) -> torch.Tensor:
    """log pi(a|s) - E_{a'~pi}[log pi(a'|s)] = log pi(a|s) + H(s) (Sec. 5; appendix "REPO-R:
    Derivation").

    The centred log-prob is the form REPO derives from Cor. 1; the paper's implementation
    approximates it by the raw log pi because it considered the mean expensive. ``logprobs``
    are the sampled tokens' log-probs and ``token_entropies`` the exact entropies H(s) of the
    distributions they were drawn from, at the same positions; both are detached, since REPO
    treats the shaping term as a constant.
    """
    logprobs = as_float_tensor("logprobs", logprobs).detach()
    token_entropies = as_float_tensor("token_entropies", token_entropies).detach()
    if logprobs.shape != token_entropies.shape:
        raise ValueError(
            f"token_entropies shape {tuple(token_entropies.shape)} must equal logprobs shape "
            f"{tuple(logprobs.shape)}; score the entropies at the sampled tokens' positions"
        )
    return logprobs + token_entropies


def repo_d(advantages: torch.Tensor, logprobs: torch.Tensor, zeta: float) -> torch.Tensor:
    """REPO-D per-token advantage (Sec. 5, A_REPO = A - beta_s * centred logp).

    A - zeta * logp with raw log-probs in place of centred ones, as the paper does for REPO-R
    (pass ``centred_logprobs`` for the exact form).
    Equivalent in expectation to an entropy bonus zeta * H (appendix "Connection to entropy
    regularization"), estimated from the sampled token alone.
    """
    logp = as_float_tensor("logprobs", logprobs).detach()
    return _broadcast_advantages(advantages, logp) - zeta * logp


@dataclass
class ZetaController:
    """Bidirectional coefficient controller (appendix listing 'Adaptive controller').

    Once per iteration: entropy above target -> relax (halve a positive zeta, flipping to
    -zeta_min once it falls below zeta_min; double a negative one up to -zeta_max); below
    target -> push (double a positive zeta up to zeta_max; halve a negative one, flipping to
    +zeta_min once its magnitude falls below zeta_min). Equal -> unchanged.
    Paper ranges: REPO-R [1e-4, 0.05], REPO-D [1e-3, 10]; start 1e-3.

    ``factor`` is the step: the listing's 2 (double / halve) by default; a factor f > 1
    multiplies and divides by f instead, and f = 1 keeps zeta where it started (a project
    extension for noisy, fast-collapsing runs; docs/demo.md).
    """

    zeta_min: float
    zeta_max: float
    zeta: float = 1e-3
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.zeta_min <= self.zeta_max:
            raise ValueError(
                f"need 0 < zeta_min <= zeta_max, got zeta_min={self.zeta_min}, zeta_max={self.zeta_max}"
            )
        if not self.factor >= 1.0:
            raise ValueError(
                f"zeta_factor must be >= 1 (2 = the paper's doubling, 1 = fixed), got {self.factor}"
            )

    def update(self, entropy: float, target: float) -> float:
        zeta = self.zeta
        f = self.factor
        if entropy > target:
            if zeta >= 0:
                zeta /= f
                if zeta < self.zeta_min:
                    zeta = -self.zeta_min
            else:
                zeta = max(-self.zeta_max, zeta * f)
        elif entropy < target:
            if zeta >= 0:
                zeta = min(self.zeta_max, zeta * f)
            else:
                zeta /= f
                if zeta > -self.zeta_min:
                    zeta = self.zeta_min
        self.zeta = zeta
        return zeta

    def state_dict(self) -> dict[str, float]:
        # the factor is configuration (the run's algo settings), not state
        return {"zeta_min": self.zeta_min, "zeta_max": self.zeta_max, "zeta": self.zeta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.zeta_min, self.zeta_max, self.zeta = (
            state["zeta_min"],
            state["zeta_max"],
            state["zeta"],
        )


@dataclass
class EpsHighController:
    """ADAPO's adaptive upper clip (Sec. 5, "ADAPO").

    Entropy below target: eps_high <- min(up * eps_high, upper) (allow more entropy increase);
    above target: eps_high <- max(down * eps_high, lower). Paper: start 0.28 in [0.2, 0.32],
    x1.05 / x0.95, with eps_low fixed at 0.2.
    """

    eps_high: float = 0.28
    lower: float = 0.2
    upper: float = 0.32
    up: float = 1.05
    down: float = 0.95

    def __post_init__(self) -> None:
        if not 0 <= self.lower <= self.eps_high <= self.upper:
            raise ValueError(
                f"need 0 <= lower <= eps_high <= upper, got {self.lower}, {self.eps_high}, {self.upper}"
            )

    def update(self, entropy: float, target: float) -> float:
        if entropy < target:
            self.eps_high = min(self.up * self.eps_high, self.upper)
        elif entropy > target:
            self.eps_high = max(self.down * self.eps_high, self.lower)
        return self.eps_high

    def state_dict(self) -> dict[str, float]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, float]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def sampled_entropy(logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over action tokens of -log pi(a_t|s_t) (paper Sec. 5 "Explicit Entropy Control Methods").

    An unbiased per-state estimate of the policy entropy that needs only the sampled tokens'
    log-probs (no logits): E_{a~pi}[-log pi(a|s)] = H(pi(.|s)). Used by the controllers.
    """
    logprobs = as_float_tensor("logprobs", logprobs).detach()
    if not isinstance(mask, torch.Tensor) or mask.shape != logprobs.shape:
        raise ValueError(f"mask must have the shape of logprobs {tuple(logprobs.shape)}")
    n = mask.sum()
    if n == 0:
        raise ValueError("mask selects no action tokens; cannot estimate entropy")
    return float((-logprobs * mask).sum() / n)


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Exact per-position entropy H = -sum_a p(a) log p(a) over the last axis, in fp32 (fp64
    input stays fp64, for the theory checks).

    Differentiable. Materialises the full distribution: fine for bandits and diagnostics; the
    LLM path computes the same quantity in vocabulary chunks (entrogym.train.logprobs).
    """
    logp = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if mask.shape != values.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal {tuple(values.shape)}")
    n = mask.sum()
    if n == 0:
        raise ValueError("mask selects no action tokens")
    return (values * mask).sum() / n


def exact_entropy(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean exact entropy over action positions from ``logits[B, T, V]`` (diagnostics, baseline)."""
    return masked_mean(token_entropy_from_logits(logits), mask.to(torch.float32))


def entropy_bonus_loss(token_entropies: torch.Tensor, mask: torch.Tensor, beta: float):
    """Loss term of the explicit entropy bonus J = J_PPO + beta * H (Sec. 5, opening).

    ``token_entropies[B, T]`` are exact per-token entropies (``token_entropy_from_logits`` or the
    chunked LLM version); returns -beta * their mean over action tokens, to add to the loss.
    In the GRPO + entropy-bonus preset beta is steered by a ZetaController like REPO's zeta.
    """
    return -beta * masked_mean(token_entropies, mask.to(token_entropies.dtype))
