"""What the ``hf`` engine's samplers return, as :class:`Completion` objects: rows cut at their
budget and stop tokens (:func:`completions`), and the log-probs ``generate`` samples with,
recorded step by step (:class:`SampledLogprobs`)."""

from __future__ import annotations

import torch

from entrogym.agents.engines.base import Completion, SamplingParams


def completions(
    new: torch.Tensor, logprobs: torch.Tensor, params: list[SamplingParams], stops: list[int]
) -> list[Completion]:
    """One completion per row of the generated ids ``new`` [B, steps] and their log-probs:
    cut at the row's ``max_tokens`` and after its first stop token (kept)."""
    new, logprobs = new.cpu(), logprobs.cpu()
    completions = []
    for row, q in enumerate(params):
        ids = new[row, : q.max_tokens].tolist()
        cut = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
        ids = ids[:cut] if cut is not None else ids
        lp = logprobs[row, : len(ids)].tolist()
        completions.append(Completion(ids, lp, "stop" if cut is not None else "length"))
    return completions


class SampledLogprobs:
    """A logits processor that changes nothing and records log_softmax(raw logits)[sampled id].

    ``generate`` calls it once per step with the raw logits (before temperature and top-k/p,
    which come after user processors) and the ids so far; the id sampled from step t's logits
    is the last id at step t + 1, so each call settles the previous step and ``finish`` the
    last. Only one step's log-softmax is kept at a time.
    """

    def __init__(self) -> None:
        self._pending: torch.Tensor | None = None  # the previous step's log-softmax [B, V]
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._settle(input_ids[:, -1:])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _settle(self, sampled: torch.Tensor) -> None:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, sampled.to(self._pending.device))[:, 0])
            self._pending = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs of the generated ids (``sequences``: prompt + generated)."""
        self._settle(sequences[:, -1:])
        if not self._steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self._steps, dim=1)
