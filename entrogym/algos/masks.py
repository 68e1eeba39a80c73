"""Token masks: which action tokens the policy loss trains on (an algorithm's ``mask`` part).

A mask keeps a subset of the action tokens in the per-token objective; the aggregation still
divides by all action tokens, as TRL does, so a mask scales the gradient down rather than
reweighting the kept tokens. It combines with any lever: the entropy bonus then acts on the
kept tokens only, as in TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from entrogym.algos.entropy import high_entropy_tokens
from entrogym.algos.registry import NoParams, Registry


class TokenMask:
    """Keep every action token (``all``); the base of every mask."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any) -> None:
        self.params = params

    @property
    def needs_entropy(self) -> bool:
        return False

    def keep(self, mask: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor | None:
        """A bool ``[b, w]`` of the action tokens to keep, or ``None`` for all of them."""
        return None


MASKS: Registry = Registry("mask", base=TokenMask)
register_mask = MASKS.register
register_mask("all")(TokenMask)


@dataclass(frozen=True)
class HighEntropyParams:
    """Knobs of the high-entropy token mask.

    Args:
        quantile: rho, the share of action tokens kept, those of highest entropy (TRL's
            ``top_entropy_quantile``; the paper recommends 0.2). 1 keeps all, 0 only the highest.
    """

    quantile: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.quantile <= 1:
            raise ValueError(f"algo.mask.quantile must be in [0, 1], got {self.quantile}")


@register_mask("high-entropy")
class HighEntropy(TokenMask):
    """Train only on the top-rho highest-entropy action tokens ("Beyond the 80/20 Rule"), from
    the exact per-token entropies of the chunked scorer (never full logits)."""

    Params = HighEntropyParams

    @property
    def needs_entropy(self) -> bool:
        return True

    def keep(self, mask: torch.Tensor, entropies: torch.Tensor | None) -> torch.Tensor:
        if entropies is None:
            raise ValueError("the high-entropy mask needs score() to return entropies")
        return high_entropy_tokens(entropies, mask, self.params.quantile)
