"""The named algorithms: compositions of parts holding the paper's values (paper Sec. 2
"Preliminaries", Sec. 5, appendix "Training"), verl's (Clip-Cov, KL-Cov) and TRL's (adaptive
entropy).

A preset is data; :func:`build_algorithm` derives a variant from a mapping of typed values,
the form YAML files hold::

    {"name": "repo-d", "controller": {"name": "pi", "kp": 0.3}, "lever": {"centering": "exact"}}

A part given by name alone (``"controller": "pi"``) starts from that part's defaults; knobs
without a name change the preset's part. Adding a lever to a preset that has none gives it the
lever's default controller. Nothing here reads text (``entrogym.commands.algo_text`` does).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from entrogym.algos.advantages import GrpoParams
from entrogym.algos.algorithm import PART_REGISTRIES, UPDATE_KNOBS, AlgorithmConfig
from entrogym.algos.controllers import (
    CONTROLLERS,
    AdditiveParams,
    FixedParams,
    MultiplicativeParams,
    PaperParams,
)
from entrogym.algos.levers import LEVERS
from entrogym.algos.losses import ClipParams
from entrogym.algos.registry import Coerce, Part, check_type


def _clip(eps_low: float | None = 0.2, eps_high: float | None = 0.2, **knobs: Any) -> Part:
    return Part("clipped", ClipParams(eps_low, eps_high, **knobs))


_GRPO = Part("grpo", GrpoParams())

ALGORITHMS: dict[str, AlgorithmConfig] = {
    # Strictly on-policy: one epoch, one minibatch holding all experience, nothing to clip.
    "rloo": AlgorithmConfig(
        "rloo", advantage=Part("rloo"), loss=_clip(None, None), epochs=1, minibatch_size=None
    ),
    "grpo": AlgorithmConfig("grpo", advantage=_GRPO),
    "loop": AlgorithmConfig("loop", advantage=Part("rloo")),
    "dapo": AlgorithmConfig("dapo", advantage=Part("rloo"), loss=_clip(0.2, 0.28)),
    "gspo": AlgorithmConfig(
        "gspo", advantage=Part("rloo"), loss=_clip(3e-4, 4e-4, ratio_level="sequence")
    ),
    # REPO's zeta ranges (REPO-R [1e-4, 0.05], REPO-D [1e-3, 10], start 1e-3) are the levers'.
    "repo-r": AlgorithmConfig(
        "repo-r",
        advantage=_GRPO,
        lever=LEVERS.part("repo-r"),
        controller=Part("paper", PaperParams()),
    ),
    "repo-d": AlgorithmConfig(
        "repo-d",
        advantage=_GRPO,
        lever=LEVERS.part("repo-d"),
        controller=Part("paper", PaperParams()),
    ),
    # eps_high starts at the loss's 0.28 and moves x1.05 / x0.95 within [0.2, 0.32].
    "adapo": AlgorithmConfig(
        "adapo",
        advantage=Part("rloo"),
        loss=_clip(0.2, 0.28),
        lever=Part("clip-high"),
        controller=Part("multiplicative", MultiplicativeParams()),
    ),
    # beta plays REPO-D's zeta (the appendix shows REPO-D == an entropy bonus with that
    # coefficient), so the lever takes REPO-D's range.
    "grpo-entropy-bonus": AlgorithmConfig(
        "grpo-entropy-bonus",
        advantage=_GRPO,
        lever=Part("entropy-bonus"),
        controller=Part("paper", PaperParams()),
    ),
    # TRL 1.16's use_adaptive_entropy on GRPO: the bonus's beta from 0 in [0, 1], +-0.005 per
    # optimizer step toward 0.2 nats, applied only while the entropy is at or below it.
    "grpo-adaptive-entropy": AlgorithmConfig(
        "grpo-adaptive-entropy",
        advantage=_GRPO,
        lever=Part("entropy-bonus"),
        controller=Part(
            "additive",
            AdditiveParams(
                target=0.2,
                target_unit="nats",
                step="optimizer",
                init=0.0,
                min=0.0,
                max=1.0,
                delta=0.005,
                gate=True,
            ),  # fmt: skip
        ),
    ),
    # verl's Clip-Cov and KL-Cov modes with verl's defaults: token-mean aggregation, clip 0.2
    # for Clip-Cov and none for KL-Cov, a fixed coefficient.
    "clip-cov": AlgorithmConfig(
        "clip-cov",
        advantage=_GRPO,
        loss=_clip(0.2, 0.2, aggregation="token-mean"),
        lever=LEVERS.part("clip-cov"),
        controller=Part("fixed", FixedParams()),
    ),
    "kl-cov": AlgorithmConfig(
        "kl-cov",
        advantage=_GRPO,
        loss=_clip(None, None, aggregation="token-mean"),
        lever=LEVERS.part("kl-cov"),
        controller=Part("fixed", FixedParams()),
    ),
}

# Keys of an algorithm mapping besides the parts.
TOP_KEYS = ("name", *UPDATE_KNOBS)


def get_algorithm(name: str) -> AlgorithmConfig:
    """The preset called ``name``, as the paper (or verl, TRL) sets it (ValueError listing the
    presets)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; presets: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def presets_with_lever() -> list[str]:
    return [n for n, p in ALGORITHMS.items() if p.controller is not None]


def split_part(kind: str, value: Any) -> tuple[str | None, dict[str, Any]]:
    """A part's value in a mapping: a name, or ``{name?: ..., knob: value}``."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, Mapping):
        knobs = dict(value)
        name = knobs.pop("name", None)
        if name is not None and not isinstance(name, str):
            raise ValueError(f"algo.{kind}: name must be a string, got {name!r}")
        return name, knobs
    raise ValueError(
        f"algo.{kind}: expected a name or a mapping of knobs, got {value!r} "
        f"(e.g. {kind}: {{name: ..., knob: value}})"
    )


def _chosen(kind: str, base: Part | None, value: Any, coerce: Coerce | None) -> Part:
    """The part ``kind`` of a variant: the preset's ``base`` with knobs changed, or a part given
    by another name from that part's defaults."""
    registry = PART_REGISTRIES[kind]
    name, knobs = split_part(kind, value)
    if kind == "lever" and name is None and base is not None and base.name == "none" and knobs:
        raise ValueError(
            f"algo.lever.{next(iter(knobs))}: this preset has no lever; presets with a lever: "
            f"{', '.join(presets_with_lever())} (or name one with algo.lever)"
        )
    if name is None or (base is not None and name == base.name):
        if base is None:
            raise ValueError(f"algo.{kind}: name the {kind} to use (e.g. {kind}: {{name: ...}})")
        changed = registry.params(base.name, knobs, coerce)  # checks and types the given knobs
        given = {k: getattr(changed, k) for k in knobs}
        return Part(base.name, registry.params(base.name, {**base.knobs(), **given}))
    return registry.part(name, knobs, coerce)


def build_algorithm(
    spec: str | Mapping[str, Any] | AlgorithmConfig, coerce: Coerce | None = None
) -> AlgorithmConfig:
    """The algorithm a preset name or mapping describes (module doc). Unknown presets, parts and
    knobs, and values a part refuses, raise a ValueError saying what is valid. ``coerce`` types
    the values first (a command line's text; see ``entrogym.algos.registry.Coerce``)."""
    if isinstance(spec, AlgorithmConfig):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"algo: expected a preset name or a mapping, got {spec!r}")
    values = dict(spec)
    if "name" not in values:
        raise ValueError(f"algo: name the preset (algo.name); presets: {', '.join(ALGORITHMS)}")
    name = values.pop("name")
    if not isinstance(name, str):
        raise ValueError(
            f"algo.name must be a preset's name, got {name!r}; presets: {', '.join(ALGORITHMS)}"
        )
    base = get_algorithm(name)
    unknown = [k for k in values if k not in UPDATE_KNOBS and k not in PART_REGISTRIES]
    if unknown:
        raise ValueError(
            f"algo.{unknown[0]} is not a setting of an algorithm; its settings: "
            f"{', '.join((*TOP_KEYS, *PART_REGISTRIES))} (a part's knobs go under it, e.g. "
            "algo.controller.max, algo.loss.eps_high)"
        )
    parts: dict[str, Any] = {}
    for kind in ("advantage", "loss", "mask", "lever"):
        base_part = getattr(base, kind)
        given = values.get(kind)
        parts[kind] = base_part if given is None else _chosen(kind, base_part, given, coerce)
    parts["controller"] = _controller(base, parts["lever"], values, coerce)
    hints = typing.get_type_hints(AlgorithmConfig)
    update = {}
    for key in (k for k in UPDATE_KNOBS if k in values):
        value = values[key] if coerce is None else coerce(key, values[key], hints[key])
        check_type(key, value, hints[key])
        update[key] = value
    return dataclasses.replace(base, **parts, **update)


def _controller(
    base: AlgorithmConfig, lever: Part, values: dict[str, Any], coerce: Coerce | None
) -> Part | None:
    """The variant's controller: the preset's (or, for a preset without a lever, the new lever's
    default controller), changed as ``values["controller"]`` says."""
    given = values.get("controller")
    if LEVERS.get(lever.name).coefficient is None:
        if given is not None:
            raise ValueError(
                f"algo.controller: preset {base.name!r} has no lever, so nothing to control; "
                f"presets with a lever: {', '.join(presets_with_lever())} (or add one with "
                "algo.lever)"
            )
        return None
    start = base.controller
    if start is None:
        default = LEVERS.get(lever.name).controller_by_default()
        suggested = LEVERS.get(lever.name).controller_knobs.get(default)
        start = Part(default, CONTROLLERS.params(default, suggested))
    if given is None:
        return start
    chosen = _chosen("controller", start, given, coerce)
    suggested = LEVERS.get(lever.name).controller_knobs.get(chosen.name)
    if chosen.name == start.name or not suggested:
        return chosen
    # another controller for this lever: the lever's suggested knobs, where the user set none
    _, set_here = split_part("controller", given)
    knobs = {**suggested, **{k: getattr(chosen.params, k) for k in set_here}}
    return Part(chosen.name, CONTROLLERS.params(chosen.name, knobs))
