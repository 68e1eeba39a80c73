"""The token draws of the ``hf`` engine's static decode paths (:data:`STATIC_DRAWS`): one
index per row of a batch's processed probabilities, by ``torch.multinomial`` as ``generate``
draws (``static``), or by inverting each row's cumulative distribution (``static-cdf``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# entries per block of the two-level inverse CDF (:func:`inverse_cdf_draw`)
CDF_BLOCK = 256


def inverse_cdf_draw(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] (non-negative, each row with positive mass) by
    inversion: the smallest ``i`` with ``cdf[i] > u``, where ``cdf`` is the row's cumulative
    sum and ``u`` is uniform on ``[0, cdf[-1])``, from torch's global generator (one float64
    draw per row). Devroye, *Non-Uniform Random Variate Generation* (1986), §III.2, the
    inversion method for discrete distributions.

    The search runs in two levels, as a table lookup by blocks does (Devroye, §III.2.4): the
    cumulative sums of the row's :data:`CDF_BLOCK`-entry block masses find ``u``'s block, and
    that block's own cumulative sum finds the entry. A full-row cumulative sum is one serial
    pass over the vocabulary (~4 ms of a decode step at SmolLM2's 49,152 entries and 24 rows);
    block sums are a parallel reduction, and only one block per row is scanned.

    The sums accumulate in float64 and ``u`` has 53 random bits, so each index is drawn with
    its probability to ~1e-16; an entry of zero probability (cut by top-k or top-p) is never
    drawn, since its cumulative value equals its predecessor's, and where the block's scan and
    its reduced mass round apart, ``u``'s offset is kept below the scan's end, at the block's
    last positive entry. Rows need not sum to one."""
    rows, vocab = probs.shape
    count = -(-vocab // CDF_BLOCK)
    if count * CDF_BLOCK != vocab:
        probs = F.pad(probs, (0, count * CDF_BLOCK - vocab))
    blocks = probs.view(rows, count, CDF_BLOCK)
    cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    # rand < 1 (at most 1 - 2**-53), and that times total rounds below total, so u < total
    u = torch.rand(total.shape, dtype=torch.float64, device=probs.device) * total
    # right=True: the first value strictly above u, so u = 0 skips leading zero mass
    block = torch.searchsorted(cdf, u, right=True)
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    picked = blocks.gather(1, block[:, :, None].expand(rows, 1, CDF_BLOCK))[:, 0]
    inner = picked.cumsum(-1, dtype=torch.float64)
    end = inner[:, -1:]
    offset = torch.minimum(u - before, torch.nextafter(end, torch.zeros_like(end)))
    return (block * CDF_BLOCK + torch.searchsorted(inner, offset, right=True))[:, 0]


def multinomial_draw(probs: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] by ``torch.multinomial``, as ``generate`` draws."""
    return torch.multinomial(probs, num_samples=1).squeeze(1)


# The token draw of each static decode path (``DecodePath``): ``generate``'s, or inverse CDF.
STATIC_DRAWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "static": multinomial_draw,
    "static-cdf": inverse_cdf_draw,
}
