"""How closely a run's entropy tracked its target: the numbers the lab, the demo and the
sweeps report.

``H_t`` is the entropy of iteration t and ``H*_t`` the target the controller aimed at (the
first iteration's entropy, a ratio of it, or nats). The deviation is ``|H_t / H*_t - 1|``.
"""

from __future__ import annotations

from collections.abc import Sequence

# The tracking goal (docs/demo.md; `entrogym compare` reports it): a held run stays within +-BAND
# of its target at every iteration from index FIRST_TRACKED (the 3rd iteration) on; the first
# two are the controller's to find its coefficient.
BAND, FIRST_TRACKED = 0.25, 2


def filled_targets(targets: Sequence[float | None], entropy: Sequence[float]) -> list[float]:
    """A run's per-iteration targets with the iterations before the target was known (a target
    taken from several first iterations) given that target: the run is judged against the one
    target it aimed at. A run that never set one (no controller) is judged against its first
    iteration's entropy."""
    known = next((t for t in targets if t is not None), entropy[0] if entropy else None)
    return [known if t is None else t for t in targets]


def deviations(entropy: Sequence[float], target: Sequence[float] | float) -> list[float]:
    """|H_t / H*_t - 1| per iteration (``target`` one value or one per iteration)."""
    targets = [target] * len(entropy) if isinstance(target, int | float) else list(target)
    if len(targets) != len(entropy):
        raise ValueError(f"{len(entropy)} entropies but {len(targets)} targets")
    return [abs(h / t - 1.0) for h, t in zip(entropy, targets, strict=True)]


def tracking_error(entropy: Sequence[float], target: Sequence[float] | float) -> float:
    """The mean deviation over the second half of the iterations (the later half when odd)."""
    devs = deviations(entropy, target)
    return sum(devs[len(devs) // 2 :]) / len(devs[len(devs) // 2 :])


def max_excursion(
    entropy: Sequence[float], target: Sequence[float] | float, start: int | None = None
) -> float:
    """The largest deviation from iteration ``start`` on (default: the second half)."""
    devs = deviations(entropy, target)
    return max(devs[len(devs) // 2 if start is None else start :])
