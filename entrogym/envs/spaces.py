"""A Gymnasium text space that holds any Unicode string up to a length bound."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Text

# Only used to draw samples: ASCII letters, digits, punctuation, whitespace and a few
# non-ASCII characters, so that sampled actions exercise what LLM text looks like.
SAMPLE_ALPHABET = (
    string.ascii_letters + string.digits + string.punctuation + " \n\t" + "éßλπ∑√≤→€中文😀"
)


class UnicodeText(Text):
    """``gymnasium.spaces.Text`` that contains every ``str`` of ``min_length..max_length`` characters.

    The stock ``Text`` space rejects any character outside its charset (by default only ASCII
    letters and digits), so LaTeX, punctuation or newlines would make LLM observations and
    actions fall outside it. This space checks only the type and the length; the charset
    (``SAMPLE_ALPHABET``) is used by :meth:`sample` alone, whose lengths are drawn up to
    ``sample_max_length`` so that random actions stay cheap to score.
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_max_length: int = 1024,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_ALPHABET, seed=seed)
        if sample_max_length < 1:
            raise ValueError(f"sample_max_length must be >= 1, got {sample_max_length}")
        self.sample_max_length = int(sample_max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            top = max(self.min_length, min(self.max_length, self.sample_max_length))
            length = int(self.np_random.integers(self.min_length, top + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    @property
    def is_np_flattenable(self) -> bool:
        # Flattening maps each character to its charset index; arbitrary Unicode has none.
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object, /) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.min_length, self.max_length))
