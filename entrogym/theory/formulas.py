"""The paper's theory as functions: predicted entropy change, PPO entropy bounds, bf16 ratio bias.

Every function computes one formula and cites it; ``entrogym.theory.checks`` tests them against
measurements.
"""

from __future__ import annotations

import torch

from entrogym.algos import token_entropy_from_logits


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) = -sum_a pi(a) log pi(a) over the last dimension (the algorithm
    core's formula; fp64 logits give an fp64 entropy)."""
    return token_entropy_from_logits(logits)


def expected_pg_logit_gradient(logits: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Exact expected policy gradient of a tabular softmax in its logits (appendix "Entropy dynamics under policy gradient for tabular softmax policies").

    g = E_{a ~ pi}[r(a) grad_s log pi(a)] = pi * (r - E_pi[r]) (the proposition in appendix "Entropy dynamics under policy gradient for tabular softmax policies" with
    grad_{s_z} log pi(x) = 1[x = z] - pi(z)).
    """
    probs = torch.softmax(logits, dim=-1)
    mean_r = (probs * rewards).sum(dim=-1, keepdim=True)
    return probs * (rewards - mean_r)


def predicted_entropy_change_tabular(
    logits: torch.Tensor, rewards: torch.Tensor, lr: float
) -> torch.Tensor:
    """First-order entropy change of one expected PG step s <- s + lr * g (the tabular-softmax corollary (appendix "Entropy dynamics under policy gradient for tabular softmax policies")).

    Delta H ~= -lr * E_{a ~ pi}[pi(a) (log pi(a) - E_pi log pi) (r(a) - E_pi r)]
             = -lr * sum_a pi(a)^2 (log pi(a) - E_pi log pi) (r(a) - E_pi r),
    the tabular form of Thm 1 / Cor 1 (Sec. 3 "Theory: Entropy dynamics of policy gradient"),
    where the score vectors of distinct actions interact only through the softmax, so the
    covariance is weighted by pi(a). Batched over leading dimensions.
    """
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    centred_logp = logp - (probs * logp).sum(dim=-1, keepdim=True)
    centred_r = rewards - (probs * rewards).sum(dim=-1, keepdim=True)
    return -lr * (probs * probs * centred_logp * centred_r).sum(dim=-1)


def ppo_entropy_bounds(
    entropy_old: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Thm 2 (Sec. 3; appendix "Entropy dynamics under clipped PPO"): if every ratio pi_new / pi_old lies in [1 - eps_low, 1 + eps_high]
    then (1 - eps_low) H_old <= H_new <= (1 + eps_high) H_old. Returns (lower, upper)."""
    return (1.0 - eps_low) * entropy_old, (1.0 + eps_high) * entropy_old


def bf16_ulp(values: torch.Tensor) -> torch.Tensor:
    """Unit in the last place of bfloat16 at each value's binade: 2^(floor(log2|x|) - 7).

    bfloat16 keeps 8 significant bits (7 stored), so on [2^e, 2^(e+1)) its spacing is 2^(e-7).
    """
    exponent = torch.floor(torch.log2(values.abs().double()))
    return torch.pow(2.0, exponent - 7)


def bf16_ratio_bias_predicted(ulp_new: torch.Tensor, ulp_old: torch.Tensor) -> torch.Tensor:
    """Thm 3 (Sec. 4.1 "16-bit Quantization of Model Outputs Affects Clipping"): E[r_obs | r_true] / r_true ~= 1 + Var(delta) / 2
    = 1 + (ulp_new^2 + ulp_old^2) / 24, with delta = eps_new - eps_old the difference of two
    independent rounding errors, each uniform on [-ulp/2, ulp/2]."""
    return 1.0 + (ulp_new**2 + ulp_old**2) / 24.0
