"""The statistics of benchmarks/llm_claims.py: clip decisions with exact and bf16-rounded
log-probs (paper Sec. 4.1 "16-bit Quantization of Model Outputs Affects Clipping", Thm 3),
their null under symmetric noise, pooling over seeds and the verdicts in plain words.
Tensors in, numbers out: nothing here loads a model."""

from __future__ import annotations

import math
from typing import Any

import torch

SIGNIFICANCE = 0.05


def clip_decisions(
    logprobs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, algo: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (lower-clipped, upper-clipped) masks, as ``clipped_policy_loss`` counts them:
    A < 0 and w < 1 - eps_low; A > 0 and w > 1 + eps_high (Sec. 2, PPO objective)."""
    from entrogym.algos.losses import clip_bounds, token_importance_ratio

    low, high = clip_bounds(algo.loss.params.eps_low, algo.loss.params.eps_high)
    ratio = token_importance_ratio(logprobs, old)
    a, m = adv[:, None], mask.bool()
    return m & (a < 0) & (ratio < low), m & (a > 0) & (ratio > high)


def bf16_ulp(values: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 numbers (8 significant bits) at ``values``."""
    return torch.exp2(torch.floor(torch.log2(values.abs())) - 7)


def thm3_ratio_bias(logprobs: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> dict:
    """Thm 3 (Sec. 4.1; appendix "Proof of Theorem 3 (BF16 Multiplicative Bias)"):
    E[r_obs | r_true] = r_true * E[exp(-delta)] ~ r_true * (1 + Var(delta) / 2), with
    Var(delta) = (ulp_new^2 + ulp_old^2) / 12 when both rounding errors are independent and
    uniform. Measured: the mean of r_obs / r_true - 1 over tokens, its standard error, and
    that prediction."""
    from entrogym.dtypes import bf16_round

    m = mask.bool()
    new, prev = logprobs[m].double(), old[m].double()
    rel = torch.exp((bf16_round(new) - bf16_round(prev)) - (new - prev)) - 1
    predicted = (bf16_ulp(new) ** 2 + bf16_ulp(prev) ** 2) / 24
    return {
        "mean": float(rel.mean()),
        "stderr": float(rel.std() / math.sqrt(rel.numel())) if rel.numel() > 1 else None,
        "predicted": float(predicted.mean()),
    }


def noise_control(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    algo: Any,
    draws: int,
    seed: int = 0,
) -> list[int]:
    """The null for the flips: the rounding model of Thm 3's proof (appendix "Proof of
    Theorem 3 (BF16 Multiplicative Bias)": independent errors uniform in +-ulp/2 on each
    log-prob) drawn ``draws`` times as noise. Per draw: flips toward Thm 3 minus flips
    against. Its mean is what the ratios' density around the clip bounds does with symmetric
    noise alone."""
    g = torch.Generator().manual_seed(seed)
    lo_e, hi_e = clip_decisions(logprobs, old, adv, mask, algo)
    new, prev = logprobs.double(), old.double()
    nets = []
    for _ in range(draws):
        noisy = [x + (torch.rand(x.shape, generator=g, dtype=x.dtype) - 0.5) * bf16_ulp(x)
                 for x in (new, prev)]  # fmt: skip
        lo, hi = clip_decisions(*noisy, adv, mask, algo)
        toward = (hi & ~hi_e).sum() + (lo_e & ~lo).sum()
        nets.append(int(toward - (hi_e & ~hi).sum() - (lo & ~lo_e).sum()))
    return nets


def bf16_clip_effect(
    logprobs: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    algo: Any,
    draws: int = 200,
) -> dict:
    """The clip statistics of one batch with exact fp32 log-probs and with both sides rounded
    to bf16 (Sec. 4.1 "16-bit Quantization of Model Outputs Affects Clipping")."""
    from entrogym.algos.losses import clipped_policy_loss
    from entrogym.dtypes import bf16_round

    out: dict[str, Any] = {
        "tokens": int(mask.sum()),
        "tokens_with_signal": int((mask.bool() & (adv[:, None] != 0)).sum()),
        "mean_abs_log_ratio": float(((logprobs - old).abs() * mask).sum() / mask.sum()),
    }
    decisions = {}
    for name, (new, prev) in {
        "fp32": (logprobs, old),
        "bf16": (bf16_round(logprobs), bf16_round(old)),
    }.items():
        _, metrics = clipped_policy_loss(
            new, prev, adv, mask, eps_low=algo.loss.params.eps_low, eps_high=algo.loss.params.eps_high,
            level="token", aggregation=algo.loss.params.aggregation,
        )  # fmt: skip
        low, high = decisions[name] = clip_decisions(new, prev, adv, mask, algo)
        out[name] = {
            "clip_frac_low": metrics["clip_frac_low"],
            "clip_frac_high": metrics["clip_frac_high"],
            "clipped_low": int(low.sum()),
            "clipped_high": int(high.sum()),
        }
    (lo_e, hi_e), (lo_r, hi_r) = decisions["fp32"], decisions["bf16"]
    out["flips"] = {
        "high_gained": int((hi_r & ~hi_e).sum()),
        "high_lost": int((hi_e & ~hi_r).sum()),
        "low_gained": int((lo_r & ~lo_e).sum()),
        "low_lost": int((lo_e & ~lo_r).sum()),
    }
    out["thm3_ratio_bias"] = thm3_ratio_bias(logprobs, old, mask)
    out["noise_control_net"] = noise_control(logprobs, old, adv, mask, algo, draws)
    return out


def sign_test(toward: int, against: int) -> float | None:
    """One-sided binomial p-value of at least ``toward`` of the flips going Thm 3's way when
    either way is equally likely (None without flips)."""
    n = toward + against
    if n == 0:
        return None
    return sum(math.comb(n, i) for i in range(toward, n + 1)) / 2**n


def pool(rows: list[dict]) -> dict:
    """Token-weighted totals of :func:`bf16_clip_effect` rows (one per seed, same step)."""
    tokens = sum(r["tokens"] for r in rows)
    out: dict[str, Any] = {"tokens": tokens, "seeds": len(rows)}
    out["tokens_with_signal"] = sum(r["tokens_with_signal"] for r in rows)
    out["mean_abs_log_ratio"] = sum(r["mean_abs_log_ratio"] * r["tokens"] for r in rows) / tokens
    for name in ("fp32", "bf16"):
        low = sum(r[name]["clipped_low"] for r in rows)
        high = sum(r[name]["clipped_high"] for r in rows)
        out[name] = {
            "clip_frac_low": low / tokens,
            "clip_frac_high": high / tokens,
            "high_over_low": high / low if low else None,
        }
    flips = {key: sum(r["flips"][key] for r in rows) for key in rows[0]["flips"]}
    toward = flips["high_gained"] + flips["low_lost"]
    against = flips["high_lost"] + flips["low_gained"]
    out["flips"] = {**flips, "toward_thm3": toward, "against_thm3": against}
    out["flips"]["p_value"] = sign_test(toward, against)
    nets = [sum(col) for col in zip(*(r["noise_control_net"] for r in rows), strict=True)]
    out["noise_control"] = {
        "draws": len(nets),
        "mean_net_toward": sum(nets) / len(nets),
        "p_value": sum(n >= toward - against for n in nets) / len(nets),
    }
    bias = [(r["thm3_ratio_bias"], r["tokens"]) for r in rows]
    out["thm3_ratio_bias"] = {
        "mean": sum(b["mean"] * n for b, n in bias) / tokens,
        "stderr": math.sqrt(sum(((b["stderr"] or 0) * n) ** 2 for b, n in bias)) / tokens,
        "predicted": sum(b["predicted"] * n for b, n in bias) / tokens,
    }
    out["verdict"] = clipping_verdict(out)
    return out


def clipping_verdict(pooled: dict) -> str:
    """Plain words for one pooled step: the paper's claim (does bf16 rounding move clip
    decisions towards the upper clip and away from the lower one?) and its cause (more than
    symmetric noise of bf16's size would do, i.e. a bias of the rounding, or not)."""
    flips, fp32, bf16, ctrl = (pooled[k] for k in ("flips", "fp32", "bf16", "noise_control"))
    toward, against = flips["toward_thm3"], flips["against_thm3"]
    fracs = (
        f"clip_frac_high {fp32['clip_frac_high']:.4f} -> {bf16['clip_frac_high']:.4f}, "
        f"clip_frac_low {fp32['clip_frac_low']:.4f} -> {bf16['clip_frac_low']:.4f} (fp32 -> bf16)"
    )
    if toward + against == 0:
        return (
            f"not shown at this scale: bf16 rounding changed no clip decision among "
            f"{pooled['tokens']} tokens (mean |log r| {pooled['mean_abs_log_ratio']:.3g}; {fracs})"
        )
    shown = toward > against and flips["p_value"] < SIGNIFICANCE
    claim = "shown" if shown else "not shown above noise"
    biased = ctrl["p_value"] < SIGNIFICANCE
    cause = (
        f"symmetric noise of bf16's size nets {ctrl['mean_net_toward']:+.1f} flips toward on "
        f"average, the rounding {toward - against:+d} (p={ctrl['p_value']:.3g}): "
        + ("more than symmetric noise, a bias of the rounding itself" if biased else
           "no more than symmetric noise acting on where the ratios sit, not a rounding bias")
    )  # fmt: skip
    return (
        f"{claim}: {toward} of {toward + against} flipped clip decisions go Thm 3's way "
        f"(sign test p={flips['p_value']:.3g}); {fracs}. Cause: {cause}"
    )


def mismatch_verdict(rows: dict[str, dict]) -> str:
    """The paper's ordering: fp32 (exact) < fp16 (10 mantissa bits) < bf16 (7) in mean |dlogp|."""
    have = [
        d for d in ("fp32", "fp16", "bf16") if d in rows and rows[d]["mean_abs_dlogp"] is not None
    ]
    values = [rows[d]["mean_abs_dlogp"] for d in have]
    listed = ", ".join(f"{d} {v:.2e}" for d, v in zip(have, values, strict=True))
    if len(have) < 2:
        return f"not enough dtypes to compare ({listed or 'none'})"
    if values == sorted(values) and len(set(values)) == len(values):
        return f"shown: mean |dlogp| grows as the sampler's precision falls ({listed})"
    return f"not shown: mean |dlogp| is not ordered fp32 < fp16 < bf16 ({listed})"
