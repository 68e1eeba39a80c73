"""The entropy formulas: estimates, and how each lever pushes entropy (one function each).

REPO-R / REPO-D reshape advantages per token with the latest policy's detached log-probs
(paper Sec. 5 and appendix listings); the entropy bonus adds beta * H; Clip-Cov and KL-Cov
(Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", as verl defines them) act on the tokens whose advantage and log-prob covary most; the
high-entropy token mask keeps the top-rho tokens by entropy (Wang et al. 2025, "Beyond the 80/20
Rule", TRL's ``top_entropy_quantile``). The levers and controllers that use them are in
``entrogym.algos.levers`` and ``entrogym.algos.controllers``.
"""

from __future__ import annotations

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
    (raw as in the paper's implementation, or ``centred_logprobs`` with ``lever.centering:
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


def exact_batch_entropy(token_entropies: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over action tokens of the exact entropy H(pi(.|s_t)) = -sum_v pi(v|s_t) log pi(v|s_t)
    at the sampled states (Rao-Blackwell, e.g. Casella & Robert, "Rao-Blackwellisation of
    sampling schemes", Biometrika 1996).

    The conditional expectation of :func:`sampled_entropy` given the states: the same mean at
    the same states, without the spread of drawing one token at each. ``token_entropies[B, T]``
    are the scorer's (``token_entropy_from_logits`` or ``entrogym.train.learner.logprobs``).
    """
    token_entropies = as_float_tensor("token_entropies", token_entropies).detach()
    if not isinstance(mask, torch.Tensor) or mask.shape != token_entropies.shape:
        raise ValueError(
            f"mask must have the shape of token_entropies {tuple(token_entropies.shape)}"
        )
    n = mask.sum()
    if n == 0:
        raise ValueError("mask selects no action tokens; cannot estimate entropy")
    return float((token_entropies * mask).sum() / n)


def relative_entropy(
    token_entropies: torch.Tensor, reference_entropies: torch.Tensor, mask: torch.Tensor
) -> float:
    """The policy's exact entropy on a batch's action tokens over a reference policy's exact
    entropy on the same tokens: sum_t H(pi(.|s_t)) / sum_t H(pi_ref(.|s_t)) (a ratio estimator
    with the reference as its auxiliary variable, Cochran, "Sampling Techniques", 3rd ed., 1977,
    ch. 6).

    Both sums run over the same sampled states, so the prompts and paths a batch happened to
    draw move numerator and denominator together and most of a batch's spread cancels; 1.0
    means the policy is as uncertain as the reference where it now goes. The controllers'
    ``estimator relative`` tracks it with the base model (the adapter switched off) as the
    reference. ``token_entropies`` and ``reference_entropies`` are ``[B, T]`` as
    :func:`exact_batch_entropy` takes them.
    """
    reference = as_float_tensor("reference_entropies", reference_entropies).detach()
    if reference.shape != mask.shape:
        raise ValueError(f"reference_entropies must have the shape of mask {tuple(mask.shape)}")
    denominator = exact_batch_entropy(reference, mask)
    if not denominator > 0:
        raise ValueError(
            "the reference policy is deterministic on every masked token (entropy 0); a ratio "
            "to it is undefined: track estimator exact instead"
        )
    return exact_batch_entropy(token_entropies, mask) / denominator


def importance_weighted_entropy(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> float:
    """Sampled entropy of a policy pi from tokens another policy mu sampled (self-normalised
    importance sampling, e.g. Owen, "Monte Carlo theory, methods and examples", ch. 9).

    With w_t = pi(a_t|s_t) / mu(a_t|s_t): sum_t w_t (-log pi(a_t|s_t)) / sum_t w_t, an estimate
    of E_{a~pi}[-log pi(a|s)] = H(pi(.|s)) at the states mu visited. With pi = mu (w = 1) it is
    :func:`sampled_entropy`. The update feeds the controller this for a stale batch
    (``--max-staleness``): the entropy of the policy being trained, not of the older one that
    sampled the batch.
    """
    logprobs = as_float_tensor("logprobs", logprobs).detach()
    sampler_logprobs = as_float_tensor("sampler_logprobs", sampler_logprobs).detach()
    if sampler_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"sampler_logprobs and mask must have the shape of logprobs {tuple(logprobs.shape)}"
        )
    weights = torch.exp(logprobs - sampler_logprobs) * mask
    total = weights.sum()
    if not total > 0:
        raise ValueError("mask selects no action tokens; cannot estimate entropy")
    return float((weights * -logprobs).sum() / total)


def token_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Exact per-position entropy H = -sum_a p(a) log p(a) over the last axis, in fp32 (fp64
    input stays fp64, for the theory checks).

    Differentiable. Materialises the full distribution: fine for bandits and diagnostics; the
    LLM path computes the same quantity in vocabulary chunks (entrogym.train.learner.logprobs).
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


def constraint_error(entropy: torch.Tensor, target: float, upper_slack: float) -> torch.Tensor:
    """The relative shortfall e = (H* - H) / H* the constraint acts on: as is below the target;
    above it, only the part past ``upper_slack`` (a relative excess the constraint tolerates,
    ``inf`` for the one-sided constraint H >= H*)."""
    error = (target - entropy) / target
    return torch.where(error > 0, error, (error + upper_slack).clamp_max(0.0))


def entropy_constraint_loss(
    token_entropies: torch.Tensor,
    mask: torch.Tensor,
    multiplier: float,
    target: float,
    penalty: float,
    upper_slack: float = 0.0,
) -> torch.Tensor:
    """Loss term of the augmented Lagrangian of the constraint H = H* (the method of
    multipliers: Hestenes 1969, Powell 1969; Bertsekas 1982, "Constrained Optimization and
    Lagrange Multiplier Methods", ch. 2), or of H* <= H <= (1 + upper_slack) H*.

    With H the mean exact token entropy over the micro-batch's action tokens and e its relative
    shortfall (``constraint_error``), the term is ``-multiplier * H + penalty / 2 * H* * e**2``.
    Its gradient is that of an entropy bonus with coefficient ``multiplier + penalty * e``: the
    multiplier (moved across steps by a controller, as dual ascent moves it) plus a
    proportional push computed from this micro-batch's own entropy, so it acts without lag and
    vanishes at the target (and within the slack above it).
    """
    entropy = masked_mean(token_entropies, mask.to(token_entropies.dtype))
    error = constraint_error(entropy, target, upper_slack)
    return -multiplier * entropy + 0.5 * penalty * target * error * error


def entropy_constraint_push_loss(
    token_entropies: torch.Tensor,
    mask: torch.Tensor,
    push: torch.Tensor,
    multiplier: float,
    target: float,
    penalty: float,
    upper_slack: float = 0.0,
) -> torch.Tensor:
    """``entropy_constraint_loss`` with the push restricted to the ``push`` tokens: the error
    e is measured on every action token of ``mask`` (what the constraint holds), and the loss
    is ``-(multiplier + penalty * e) * H_push`` with e held fixed, so its gradient is the
    constraint's entropy bonus acting on the ``push`` tokens alone (0 if there are none).
    With ``push == mask`` the gradient equals ``entropy_constraint_loss``'s.
    """
    dtype = token_entropies.dtype
    entropy = masked_mean(token_entropies.detach(), mask.to(dtype))
    error = constraint_error(entropy, target, upper_slack)
    weights = push.to(dtype)
    if not bool(weights.any()):
        return (token_entropies * weights).sum()  # a zero that keeps the graph
    pushed = masked_mean(token_entropies, weights)
    return -(multiplier + penalty * error) * pushed


def token_covariance(
    advantages: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """(A - mean A)(log pi - mean log pi) per action token, 0 elsewhere (Cui et al. 2025, Sec. 4;
    verl ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov``).

    The means run over the batch's action tokens (``mask > 0``); ``advantages`` are ``[B]`` or
    ``[B, T]``. The covariance of a token's advantage and log-prob is what drives the entropy
    down (the paper's Cor. 1 for softmax policies), so the levers below act on its largest terms.
    Detached: it selects tokens, it is not differentiated.
    """
    logp = as_float_tensor("logprobs", logprobs).detach()
    adv = _broadcast_advantages(advantages, logp).detach()
    if not isinstance(mask, torch.Tensor) or mask.shape != logp.shape:
        raise ValueError(f"mask must have the shape of logprobs {tuple(logp.shape)}")
    valid = mask > 0
    if not bool(valid.any()):
        return torch.zeros_like(logp)
    centred_adv = adv - adv[valid].mean()
    centred_logp = logp - logp[valid].mean()
    return torch.where(valid, centred_adv * centred_logp, torch.zeros_like(logp))


def entropy_neutral_zeta(
    advantages: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor
) -> float:
    """The REPO-D coefficient that cancels a policy-gradient step's first-order entropy change
    on this batch: zeta* = Cov(log pi, A) / Var(log pi) over the action tokens.

    Cor. 1 (``thm:sm-mdp``) gives the entropy change of a softmax policy-gradient step as
    -lr Cov_{a~pi}(log pi(a), A(a)); Cui et al. 2025 (Sec. 4) estimate that covariance from the
    sampled tokens (:func:`token_covariance`). Centred REPO-D shaping,
    A' = A - zeta (log pi - mean log pi), lowers the covariance by zeta Var(log pi), so at zeta*
    the estimated first-order change is zero, in either direction. 0 when fewer than two
    action tokens or log pi does not vary.
    """
    logp = as_float_tensor("logprobs", logprobs).detach()
    covariance = token_covariance(advantages, logp, mask)
    valid = mask > 0
    if int(valid.sum()) < 2:
        return 0.0
    variance = float(logp[valid].var(unbiased=False))
    if variance <= 1e-12:
        return 0.0
    return float(covariance[valid].mean()) / variance


def centred_repo_d(
    advantages: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor, zeta: float
) -> torch.Tensor:
    """REPO-D with the log-prob centred on the batch: A - zeta (log pi - mean log pi), the mean
    over the action tokens (``mask > 0``). Centring on the batch keeps the shaping from moving
    every advantage by the same amount, which would push up every sampled token."""
    logp = as_float_tensor("logprobs", logprobs).detach()
    valid = mask > 0
    centre = logp[valid].mean() if bool(valid.any()) else logp.new_zeros(())
    return repo_d(advantages, logp - centre, zeta)


def clip_cov_tokens(
    covariance: torch.Tensor,
    mask: torch.Tensor,
    clipped: torch.Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip-Cov's token choice (verl ``compute_policy_loss_clip_cov``): among action tokens not
    already clipped by the PPO clip and with lb < covariance < ub, ``max(int(ratio * n), 1)``
    chosen uniformly at random (n = action tokens); their gradient is then detached.

    Returns a bool ``[B, T]`` mask of the chosen tokens. ``ratio <= 0`` chooses none (the lever
    is off; verl requires ratio > 0).
    """
    chosen = torch.zeros_like(mask, dtype=torch.bool)
    if ratio <= 0:
        return chosen
    valid = mask > 0
    eligible = (covariance > lb) & (covariance < ub) & valid & ~clipped
    candidates = eligible.nonzero()
    count = max(int(ratio * int(valid.sum())), 1)
    if len(candidates) == 0:
        return chosen
    order = torch.randperm(len(candidates), generator=generator)
    picked = candidates[order[: min(count, len(candidates))]]
    chosen[picked[:, 0], picked[:, 1]] = True
    return chosen


def kl_cov_tokens(covariance: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """KL-Cov's token choice (verl ``compute_policy_loss_kl_cov``): the ``max(1, int(n * ratio))``
    action tokens with the largest covariance (n = action tokens). Bool ``[B, T]``.
    ``ratio <= 0`` chooses none."""
    chosen = torch.zeros_like(mask, dtype=torch.bool)
    valid = (mask > 0).flatten()
    if ratio <= 0 or not bool(valid.any()):
        return chosen
    index = valid.nonzero().flatten()
    values = covariance.flatten()[index]
    count = max(1, int(len(values) * ratio))
    top = index[torch.topk(values, count, largest=True).indices]
    chosen.view(-1)[top] = True
    return chosen


def kl_cov_penalty(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, chosen: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """KL-Cov's per-token penalty (verl ``compute_policy_loss_kl_cov``): kl_coef * |log pi -
    log pi_old| on the chosen tokens, 0 elsewhere; subtracted from the objective."""
    return torch.where(chosen, kl_coef * (logprobs - old_logprobs).abs(), 0.0)


def high_entropy_tokens(
    token_entropies: torch.Tensor, mask: torch.Tensor, quantile: float
) -> torch.Tensor:
    """The top-``quantile`` action tokens by entropy (Wang et al. 2025, "Beyond the 80/20 Rule";
    TRL ``GRPOTrainer.get_high_entropy_mask``): tokens whose entropy is at least the
    (1 - quantile)-quantile of the action tokens' entropies. ``quantile`` 1 keeps every action
    token, 0 only the highest. Bool ``[B, T]``."""
    entropies = as_float_tensor("token_entropies", token_entropies).detach()
    valid = mask > 0
    if not bool(valid.any()):
        return valid
    threshold = torch.quantile(entropies[valid].float(), 1.0 - quantile)
    return (entropies * valid >= threshold) & valid
