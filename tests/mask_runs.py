"""Turns in a token mask, found by a plain loop (the tests' independent reading of
``entrogym.algos.turns.turn_ids``)."""

from __future__ import annotations


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """Maximal [start, end) stretches of 1s."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
