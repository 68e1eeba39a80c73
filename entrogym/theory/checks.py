"""Numerical checks of the paper's theory: Cor. 1 (tabular softmax), Thm 2, Thm 3, softmax fix.

``entrogym theory --json`` prints one JSON object with every measured number; the exit code is 1
when Cor. 1's correlation is below 0.99 or Thm 2's bound is violated.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from entrogym.theory.formulas import (
    bf16_ratio_bias_predicted,
    bf16_ulp,
    ppo_entropy_bounds,
    predicted_entropy_change_tabular,
    softmax_entropy,
)
from entrogym.theory.numerics import (
    FP32_SOFTMAX_THRESHOLD,
    log_softmax_grad,
    observed_ratio_bf16,
    trainer_logit_grad,
)

COR1_MIN_PEARSON = 0.99
# The (eps_low, eps_high) pairs of the presets: symmetric PPO/GRPO, DAPO, GSPO.
CLIP_RANGES = ((0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4))


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    return float((x * y).sum() / (x.norm() * y.norm()))


def _random_policy(gen: torch.Generator, max_arms: int = 32) -> torch.Tensor:
    """Logits of a random softmax policy: 2..max_arms actions, scale from near-flat to peaked."""
    k = int(torch.randint(2, max_arms + 1, (1,), generator=gen))
    scale = 0.2 + 3.0 * float(torch.rand((), generator=gen, dtype=torch.float64))
    return scale * torch.randn(k, generator=gen, dtype=torch.float64)


def check_cor1(n_policies: int = 500, lr: float = 1e-2, seed: int = 0) -> dict[str, Any]:
    """the tabular-softmax corollary (appendix "Entropy dynamics under policy gradient for tabular softmax policies"): predicted vs measured entropy change of one exact expected PG step.

    For each random policy and reward vector in [0, 1]^K the exact gradient of J = E_pi[r] in the
    logits comes from autograd (not from the formula), the step s <- s + lr * grad J is taken and
    the exact entropy change is compared with the first-order prediction.
    """
    if n_policies < 2:
        raise ValueError(f"n_policies must be >= 2 for a correlation, got {n_policies}")
    gen = torch.Generator().manual_seed(seed)
    predicted, measured = [], []
    for _ in range(n_policies):
        logits = _random_policy(gen).requires_grad_(True)
        rewards = torch.rand(logits.shape[0], generator=gen, dtype=torch.float64)
        (torch.softmax(logits, dim=-1) * rewards).sum().backward()
        with torch.no_grad():
            stepped = logits + lr * logits.grad
            measured.append(softmax_entropy(stepped) - softmax_entropy(logits))
            predicted.append(predicted_entropy_change_tabular(logits, rewards, lr))
    p, m = torch.stack(predicted), torch.stack(measured)
    slope = float((p * m).sum() / (p * p).sum())
    return {
        "cor1_pearson": pearson(p, m),
        "cor1_slope": slope,
        "cor1_max_abs_error": float((p - m).abs().max()),
        "cor1_mean_abs_change": float(m.abs().mean()),
        "cor1_n": n_policies,
        "cor1_lr": lr,
    }


def _new_policy_inside(
    old: torch.Tensor, eps_low: float, eps_high: float, gen: torch.Generator
) -> torch.Tensor:
    """A random new policy whose ratios pi_new / pi_old all lie in [1 - eps_low, 1 + eps_high]:
    move the logits along a random direction by a random fraction of the largest step that keeps
    every ratio inside (found by bisection)."""
    direction = torch.randn(old.shape, generator=gen, dtype=torch.float64)
    logp_old = torch.log_softmax(old, dim=-1)

    def inside(t: float) -> bool:
        ratio = torch.exp(torch.log_softmax(old + t * direction, dim=-1) - logp_old)
        return bool((ratio >= 1 - eps_low).all() and (ratio <= 1 + eps_high).all())

    lo, hi = 0.0, 1.0
    while inside(hi) and hi < 1e6:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if inside(mid) else (lo, mid)
    # Half the pairs sit on the boundary (where the bound is tightest), half strictly inside.
    u = float(torch.rand((), generator=gen, dtype=torch.float64))
    return old + (lo if u < 0.5 else lo * (2 * u - 1)) * direction


def check_ppo_bound(n_pairs: int = 1500, seed: int = 1) -> dict[str, Any]:
    """Thm 2 (Sec. 3; appendix "Entropy dynamics under clipped PPO") on random old/new pairs with every ratio inside the clip range."""
    gen = torch.Generator().manual_seed(seed)
    violations, margins, tightest = 0, [], math.inf
    for i in range(n_pairs):
        eps_low, eps_high = CLIP_RANGES[i % len(CLIP_RANGES)]
        old = _random_policy(gen, max_arms=64)
        new = _new_policy_inside(old, eps_low, eps_high, gen)
        ratio = torch.exp(torch.log_softmax(new, -1) - torch.log_softmax(old, -1))
        if not bool(((ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)).all()):
            raise RuntimeError("internal error: generated pair has a ratio outside the clip range")
        h_old, h_new = softmax_entropy(old), softmax_entropy(new)
        lower, upper = ppo_entropy_bounds(h_old, eps_low, eps_high)
        # float64 round-off only; a real violation is many orders of magnitude larger.
        tol = 1e-12 * float(h_old)
        violations += int(float(h_new) < float(lower) - tol or float(h_new) > float(upper) + tol)
        margin = min(float(h_new - lower), float(upper - h_new)) / float(h_old)
        margins.append(margin)
        tightest = min(tightest, margin / (eps_low + eps_high))
    return {
        "ppo_bound_violations": violations,
        "ppo_bound_n": n_pairs,
        "ppo_bound_clip_ranges": [list(r) for r in CLIP_RANGES],
        # How close the pairs came to the bound, in units of H_old (0 = touching it).
        "ppo_bound_min_margin": min(margins),
        "ppo_bound_median_margin": float(torch.tensor(margins).median()),
    }


def check_bf16_bias(n: int = 2_000_000, seed: int = 2) -> dict[str, Any]:
    """Thm 3 (Sec. 4.1 "16-bit Quantization of Model Outputs Affects Clipping"): mean r_observed / r_true when both fp32 log-probs are rounded
    to bf16, against the prediction 1 + Var(delta)/2 = 1 + (ulp_new^2 + ulp_old^2)/24.

    |log pi_old| is log-uniform on [1/8, 32] (sampled-token log-probs of an LLM), r_true on
    [0.5, 2]; per binade of |log pi_old| the measured and predicted excess are reported too.
    """
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(-3 + 8 * torch.rand(n, generator=gen, dtype=torch.float64))
    old = (-magnitude).float()
    log_r = torch.log(0.5 + 1.5 * torch.rand(n, generator=gen, dtype=torch.float64))
    new = (old.double() + log_r).clamp(max=-1e-6).float()
    r_true = torch.exp(new.double() - old.double())
    ratio = observed_ratio_bf16(new.double(), old.double()) / r_true
    predicted = bf16_ratio_bias_predicted(bf16_ulp(new), bf16_ulp(old))
    binade = torch.floor(torch.log2(old.double().abs())).long()
    by_binade = []
    for e in range(int(binade.min()), int(binade.max()) + 1):
        sel = binade == e
        by_binade.append(
            {
                "abs_logp_old": [2.0**e, 2.0 ** (e + 1)],
                "n": int(sel.sum()),
                "measured_excess": float(ratio[sel].mean() - 1),
                "predicted_excess": float(predicted[sel].mean() - 1),
                "stderr": float(ratio[sel].std() / math.sqrt(int(sel.sum()))),
            }
        )
    return {
        "measured": float(ratio.mean()),
        "predicted": float(predicted.mean()),
        "stderr": float(ratio.std() / math.sqrt(n)),
        "n": n,
        "by_binade": by_binade,
    }


def check_softmax_grad(n_rows: int = 4000, vocab: int = 256, seed: int = 3) -> dict[str, Any]:
    """Appendix "Softmax Gradient Numerical Precision": the sampled token's gradient 1 - p vanishes in fp32
    once p > 1 - 2^-23; the fp64 recomputation of that one term restores it. "fixed" is the
    trainer's own scorer (``entrogym.train.learner.logprobs.token_logprobs`` with ``softmax_fix``).

    Rows have a sampled (top) token with 1 - p log-uniform on [1e-9, 1e-1]; the reference is the
    autograd gradient in float64 of the same float32 logits.
    """
    gen = torch.Generator().manual_seed(seed)
    others = torch.randn(n_rows, vocab, generator=gen, dtype=torch.float64)
    complement = 10.0 ** (-9 + 8 * torch.rand(n_rows, generator=gen, dtype=torch.float64))
    targets = torch.zeros(n_rows, dtype=torch.long)
    rest = torch.logsumexp(others[:, 1:], dim=-1)
    others[:, 0] = rest - torch.log(complement / (1 - complement))
    logits = others.float()
    reference = log_softmax_grad(logits.double(), targets)
    p_true = 1.0 - reference[:, 0]
    fp32 = log_softmax_grad(logits, targets)
    fixed = trainer_logit_grad(logits, targets, softmax_fix=True)
    unfixed = trainer_logit_grad(logits, targets, softmax_fix=False)
    above = p_true > 1.0 - FP32_SOFTMAX_THRESHOLD
    vanished = fp32[:, 0] == 0

    def rel(g: torch.Tensor, rows: torch.Tensor) -> float:
        err = (g[rows, 0].double() - reference[rows, 0]).abs() / reference[rows, 0]
        return float(err.max()) if err.numel() else 0.0

    return {
        "threshold_p": 1.0 - FP32_SOFTMAX_THRESHOLD,
        "n": n_rows,
        "n_above_threshold": int(above.sum()),
        "vanished_share_above_threshold": float(vanished[above].float().mean()),
        "vanished_share_below_threshold": float(vanished[~above].float().mean()),
        "trainer_unfixed_vanished_share_above_threshold": float(
            (unfixed[:, 0] == 0)[above].float().mean()
        ),
        # Max relative error of the sampled token's gradient against the fp64 reference.
        "fp32_max_rel_error_sampled": rel(fp32, torch.ones_like(above)),
        "fp32_max_rel_error_sampled_below_threshold": rel(fp32, ~above),
        "fixed_max_rel_error_sampled": rel(fixed, above),
        "fixed_max_rel_error_sampled_below_threshold": rel(fixed, ~above),
        "fixed_max_abs_error": float((fixed.double() - reference).abs().max()),
    }


def run_checks(
    n_policies: int = 500, n_pairs: int = 1500, n_bf16: int = 2_000_000, seed: int = 0
) -> dict[str, Any]:
    """All checks as one JSON-ready dict (the output of ``entrogym theory --json``)."""
    if n_policies < 200 or n_pairs < 1000:
        raise ValueError(
            f"n_policies must be >= 200 and n_pairs >= 1000 (got {n_policies}, {n_pairs}): "
            "fewer samples would not test the claims"
        )
    result: dict[str, Any] = {}
    result.update(check_cor1(n_policies, seed=seed))
    result.update(check_ppo_bound(n_pairs, seed=seed + 1))
    result["bf16_bias"] = check_bf16_bias(n_bf16, seed=seed + 2)
    result["softmax_grad"] = check_softmax_grad(seed=seed + 3)
    result["passed"] = bool(
        result["cor1_pearson"] >= COR1_MIN_PEARSON and result["ppo_bound_violations"] == 0
    )
    return result


def print_human(r: dict[str, Any]) -> None:
    bf, sg = r["bf16_bias"], r["softmax_grad"]
    print(
        f"Cor 1 (tabular softmax): pearson {r['cor1_pearson']:.6f} over {r['cor1_n']} policies, "
        f"slope {r['cor1_slope']:.4f}"
    )
    print(
        f"Thm 2 (clip bound):      {r['ppo_bound_violations']} violations in {r['ppo_bound_n']} "
        f"pairs, min margin {r['ppo_bound_min_margin']:.2e} H_old"
    )
    print(
        f"Thm 3 (bf16 ratio bias): measured {bf['measured']:.6f} +- {bf['stderr']:.1e}, "
        f"predicted {bf['predicted']:.6f}"
    )
    print(
        f"softmax fp32 gradient:   {sg['vanished_share_above_threshold']:.1%} vanish above "
        f"p > 1 - 2^-23 ({sg['n_above_threshold']} rows); fp64 fix max rel error "
        f"{sg['fixed_max_rel_error_sampled']:.1e}"
    )
    print("PASSED" if r["passed"] else "FAILED")
