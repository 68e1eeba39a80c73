"""The static decoder's key/value caches kept between ``generate`` calls, one per conversation
(``cache_keys``), so that a conversation's next turn prefills only what it adds.

After a call, each keyed row of the batch's cache is remembered as a :class:`Kept`: the ids
whose keys and values the row holds and the columns they lie in. The batch cache itself is not
copied: every kept row points into it, and it is freed once no row of it is kept. The next
call copies each conversation's reused columns into its own batch cache
(``StaticDecoder._prefill``), one copy of the reused tokens per call against a full prefill's
forward over them.

What is reused is decided on the ids alone (:func:`common_prefix`): the keys and values of a
token depend only on the tokens before it, so the longest common prefix of the kept ids and the
new prompt is exactly what a full prefill would compute for those columns, up to rounding (a
decode step and a prefill sum in other orders). :class:`KeptCaches` holds them, by key, within
a byte budget, the least recently used batch caches dropped first; every entry belongs to one
decoder (one version of the weights) and goes with it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# A batch cache: (keys, values) per layer, rows first.
Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Kept:
    """One conversation's cached tokens: ``ids`` in order, at the column ``spans`` ([start,
    end), in order) of row ``row`` of the batch cache ``layers``; ``owner``: the id of the
    decoder (the weights) that computed them."""

    ids: list[int]
    layers: Layers
    row: int
    spans: list[tuple[int, int]]
    owner: int

    def __post_init__(self) -> None:
        if sum(end - start for start, end in self.spans) != len(self.ids):
            raise ValueError("Kept: the spans must hold exactly the ids")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest prefix ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def cache_bytes(layers: Layers) -> int:
    """The bytes a batch cache holds."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


class KeptCaches:
    """The :class:`Kept` rows by cache key, within ``limit_bytes`` of batch caches."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[Hashable, Kept] = OrderedDict()  # least recently used first
        self.hits = self.misses = self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable | None, owner: int) -> Kept | None:
        """The row kept under ``key`` by the decoder ``owner`` (None: none)."""
        kept = None if key is None else self._entries.get(key)
        if kept is None or kept.owner != owner:
            return None
        self._entries.move_to_end(key)
        return kept

    def count(self, reused: int) -> None:
        """Record one keyed prompt that reused ``reused`` tokens (0: a miss)."""
        if reused:
            self.hits += 1
            self.reused_tokens += reused
        else:
            self.misses += 1

    def put(self, key: Hashable, kept: Kept) -> None:
        self._entries[key] = kept
        self._entries.move_to_end(key)
        self._trim()

    def keep_call(
        self,
        decoder: Any,
        keys: Sequence[Hashable | None],
        prompts: Sequence[list[int]],
        completions: Sequence[list[int]],
    ) -> None:
        """Count and remember each keyed row of ``decoder``'s last call (a ``StaticDecoder``:
        its ``reused(row)`` and ``kept_row(row, prompt, completion)``) for its key's next
        turn."""
        for row, (key, prompt, ids) in enumerate(zip(keys, prompts, completions, strict=True)):
            if key is not None:
                self.count(decoder.reused(row))
                self.put(key, decoder.kept_row(row, prompt, ids))

    def forget(self, keys: Iterable[Hashable] | None = None) -> None:
        """Drop the rows kept under ``keys`` (None: all)."""
        if keys is None:
            self._entries.clear()
            return
        for key in keys:
            self._entries.pop(key, None)

    def keep_owners(self, owners: set[int]) -> None:
        """Drop every row computed by a decoder not in ``owners`` (one that was dropped)."""
        for key in [k for k, kept in self._entries.items() if kept.owner not in owners]:
            del self._entries[key]

    def held_bytes(self) -> int:
        """The bytes of the batch caches the kept rows hold alive."""
        caches = {id(kept.layers): kept.layers for kept in self._entries.values()}
        return sum(cache_bytes(layers) for layers in caches.values())

    def _trim(self) -> None:
        """Past the budget, drop whole batch caches, the least recently used first: a batch
        cache is only freed once none of its rows is kept."""
        while self._entries and self.held_bytes() > self.limit_bytes:
            oldest = next(iter(self._entries.values())).layers
            for key in [k for k, kept in self._entries.items() if kept.layers is oldest]:
                del self._entries[key]


def shared_prefix(prompts: list[tuple[int, ...]]) -> int:
    """The length of the prefix every prompt begins with (0 for fewer than two prompts), kept
    below the shortest prompt's length, so that each prompt has a token of its own to end on."""
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n
