"""The independent side of the decode paths' log-prob tests: a teacher-forced forward of the
sampled tokens through a plain ``transformers`` model, in float64 after the logits."""

from __future__ import annotations

import torch


def teacher_forced_logprobs(
    model: torch.nn.Module, prompt: list[int], tokens: list[int]
) -> list[float]:
    """log p(token | prompt, tokens before it) for each of ``tokens``, on the model's device."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    positions = range(len(prompt) - 1, ids.shape[1] - 1)
    return [logp[t, ids[0, t + 1]].item() for t in positions]
