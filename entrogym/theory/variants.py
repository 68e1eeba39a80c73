"""Labelled preset variants for the bandit lab: ``"repo-r (zeta_max=0.5)"``.

A label is a preset name, optionally followed by knob overrides in parentheses, separated by
spaces (or commas): ``"adapo (epochs=8 minibatch_size=32)"``. The lab resolves every entry of
``LabConfig.algos`` with :func:`get_algorithm`, so a variant runs through exactly the code path
of its preset, with ``entrogym.algos.presets.get_algorithm(name, **overrides)``. The presets
themselves keep the paper's values; variants only scale a few knobs to the toy.
"""

from __future__ import annotations

import re
import typing
from dataclasses import fields

from entrogym.algos import presets
from entrogym.algos.presets import ALGORITHMS, AlgorithmConfig

_LABEL = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*(?:\((.*)\))?\s*$")
# Knobs a user may never set on a preset (identity and the kind of control are the preset).
_FIXED_FIELDS = ("name", "entropy_control", "control")
# Each control's own knobs; every other field is common to all presets.
_CONTROL_KNOBS = {
    "repo-r": ("zeta_init", "zeta_min", "zeta_max", "repo_centering"),
    "repo-d": ("zeta_init", "zeta_min", "zeta_max", "repo_centering"),
    "entropy-bonus": ("zeta_init", "zeta_min", "zeta_max"),
    "adapo": ("eps_high_min", "eps_high_max", "eps_high_up", "eps_high_down"),
}


def _control_of(config: AlgorithmConfig) -> str | None:
    # ``entropy_control`` is renamed ``control`` by the Architecture issue; accept both.
    return getattr(config, "control", getattr(config, "entropy_control", None))


def preset_knobs(name: str) -> tuple[str, ...]:
    """The knobs a user may set on preset ``name`` (common ones plus its control's own).

    Uses ``entrogym.algos.presets.preset_knobs`` when the algos layer provides it; otherwise
    derives the same from the fields of ``AlgorithmConfig``.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(ALGORITHMS)}")
    upstream = getattr(presets, "preset_knobs", None)
    if upstream is not None:
        return tuple(upstream(name))
    all_control_knobs = {k for knobs in _CONTROL_KNOBS.values() for k in knobs}
    own = _CONTROL_KNOBS.get(_control_of(ALGORITHMS[name]) or "", ())
    return tuple(
        f.name
        for f in fields(AlgorithmConfig)
        if f.name not in _FIXED_FIELDS and (f.name not in all_control_knobs or f.name in own)
    )


def parse_knob_value(knob: str, text: str) -> object:
    """``text`` converted to the type of ``AlgorithmConfig.<knob>`` ("none" for optional ones)."""
    hints = typing.get_type_hints(AlgorithmConfig)
    if knob not in hints:
        raise ValueError(f"unknown preset knob {knob!r}; known: {', '.join(sorted(hints))}")
    return convert(knob, text, hints[knob])


def convert(name: str, text: str, hint: object) -> object:
    """``text`` as a value of type ``hint`` (int, float, str, bool, or Optional of those)."""
    text = str(text).strip()
    args = typing.get_args(hint)
    if type(None) in args:
        if text.lower() in ("none", "null"):
            return None
        hint = next(a for a in args if a is not type(None))
    try:
        if hint is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if hint in (int, float):
            return hint(text)
    except ValueError:
        raise ValueError(
            f"{name}: cannot read {text!r} as {getattr(hint, '__name__', hint)}"
        ) from None
    return text


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
