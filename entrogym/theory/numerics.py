"""Finite-precision effects of the paper's Sec. 4 and appendix "Numerical considerations"."""

from __future__ import annotations

import torch

from entrogym.dtypes import bf16_round

# Below this complement, 1 - p rounds to 0 in float32 (half an ulp of 1.0 is 2^-24; the paper
# states the threshold as p > 1 - 2^-23, appendix "Softmax Gradient Numerical Precision").
FP32_SOFTMAX_THRESHOLD = 2.0**-23


def observed_ratio_bf16(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """r_observed = exp(bf16(log pi_new) - bf16(log pi_old)) (Sec. 4.1 "16-bit Quantization of Model Outputs Affects Clipping")."""
    return torch.exp(bf16_round(logprobs) - bf16_round(old_logprobs))


def log_softmax_grad(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """d/d logits of sum_i log softmax(logits_i)[targets_i], by autograd in the logits' dtype.

    The sampled token's entry is 1 - p; in float32 it is exactly 0 once p > 1 - 2^-23, while the
    other entries -p_j stay non-zero (appendix "Softmax Gradient Numerical Precision").
    """
    x = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(x, dim=-1).gather(-1, targets[..., None]).sum().backward()
    return x.grad


def trainer_logit_grad(
    logits: torch.Tensor, targets: torch.Tensor, softmax_fix: bool
) -> torch.Tensor:
    """The same gradient through the trainer's scorer ``entrogym.train.learner.logprobs.token_logprobs``
    (chunked fp32 path), with or without its fp64 fix of the sampled token's term (appendix
    appendix "Softmax Gradient Numerical Precision"). An identity LM head makes the hidden states the logits, so the
    gradient with respect to the hidden states is the gradient with respect to the logits."""
    from entrogym.train.learner.logprobs import token_logprobs

    hidden = logits.detach().float().clone().requires_grad_(True)
    eye = torch.eye(logits.shape[-1])
    token_logprobs(hidden, eye, targets, impl="chunked", softmax_fix=softmax_fix).sum().backward()
    return hidden.grad
