"""Labelled preset variants for the bandit lab: ``"repo-r (zeta_max=0.5)"``.

A label is a preset name, optionally followed by knob overrides in parentheses, separated by
spaces (or commas): ``"adapo (epochs=8 minibatch_size=32)"``. The lab resolves every entry of
``LabConfig.algos`` with :func:`get_algorithm`, so a variant runs through exactly the code path
of its preset, with ``entrogym.algos.presets.get_algorithm(name, **overrides)``. The presets
themselves keep the paper's values; variants only scale a few knobs to the toy.
"""

from __future__ import annotations

import re

from entrogym.algos import presets
from entrogym.algos.presets import AlgorithmConfig, convert, parse_knob_value, preset_knobs

__all__ = [
    "convert", "get_algorithm", "parse_knob_value", "parse_variant", "preset_knobs",
    "variant_label",
]  # fmt: skip

_LABEL = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\((.*)\))?\s*$")


def parse_variant(label: str) -> tuple[str, dict[str, object]]:
    """``"repo-r (zeta_max=0.5)"`` -> ``("repo-r", {"zeta_max": 0.5})``; checks the knobs."""
    match = _LABEL.match(label)
    if match is None:
        raise ValueError(
            f"algos: cannot read {label!r}; write a preset name, optionally with knobs, "
            f"e.g. 'repo-r (zeta_max=0.5 epochs=4)'"
        )
    name, inner = match.group(1), match.group(2) or ""
    knobs = preset_knobs(name)
    overrides: dict[str, object] = {}
    for item in (part for part in re.split(r"[\s,]+", inner.strip()) if part):
        key, sep, value = item.partition("=")
        if not sep or key not in knobs:
            raise ValueError(
                f"algos: {item!r} in {label!r} is not a knob=value of preset {name!r}; "
                f"its knobs: {', '.join(knobs)}"
            )
        overrides[key] = parse_knob_value(key, value)
    return name, overrides


def variant_label(name: str, overrides: dict[str, object]) -> str:
    """The label of preset ``name`` with ``overrides`` (the bare name when there are none)."""
    if not overrides:
        return name
    return f"{name} ({' '.join(f'{k}={v}' for k, v in overrides.items())})"


def get_algorithm(label: str, **overrides: object) -> AlgorithmConfig:
    """``entrogym.algos.presets.get_algorithm`` for a preset name or a labelled variant."""
    name, knobs = parse_variant(label)
    return presets.get_algorithm(name, **{**knobs, **overrides})
