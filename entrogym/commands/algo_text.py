"""The one spelling of an algorithm: on the command line, in labels, and in YAML.

Command line (``entrogym train``, ``bandit``, ``bandit sweep``, ``demo``)::

    --algo repo-d                          a preset
    --algo.epochs 1                        a setting of the update (epochs, minibatch-size,
                                           is-correction, is-clip-min, is-clip-max)
    --algo.controller pi                   swap a part (advantage, loss, mask, lever, controller)
    --algo.controller.kp 0.3               set a knob of a part
    --algo.lever my_module:my-lever        a part of yours: module:name

YAML: ``algo: {name: repo-d, controller: {name: pi, kp: 0.3}, lever: {centering: exact}}``.

A labelled variant (the lab's ``--algos``, the demo's runs) is the preset name followed by the
same options: ``"repo-d --algo.controller pi --algo.controller.kp 0.3"``. Every form becomes one
mapping (:func:`algo_args_mapping`, :func:`parse_label`), merged over the YAML's
(:func:`merge_specs`) and resolved by ``entrogym.algos.build_algorithm``, which this module
hands a converter from text to each knob's type.
"""

from __future__ import annotations

import shlex
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal, get_args, get_origin

import docstring_parser

from entrogym import yaml_limits
from entrogym.algos import (
    ALGORITHMS,
    PART_REGISTRIES,
    AlgorithmConfig,
    algorithm_mapping,
    build_algorithm,
)
from entrogym.algos.algorithm import UPDATE_KNOBS
from entrogym.algos.correction import CORRECTION_MODES
from entrogym.algos.registry import type_name

OPTION = "--algo"
# The part a knob belongs to is named by its path: algo.<part>[.<knob>] or algo.<setting>.
SETTINGS = ("name", *UPDATE_KNOBS)
TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


def _key(word: str) -> str:
    return word.replace("-", "_")


def is_algo_option(token: str) -> bool:
    option = token.split("=", 1)[0]
    return option == OPTION or option.startswith(OPTION + ".")


def split_algo_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` split into its ``--algo`` options (each with its value) and the rest."""
    algo, rest = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not is_algo_option(token):
            rest.append(token)
            continue
        if "=" in token:
            algo.append(token)
        elif i < len(argv) and not argv[i].startswith("--"):
            algo.append(f"{token}={argv[i]}")
            i += 1
        else:
            raise ValueError(f"{token} needs a value, e.g. {OPTION} repo-r")
    return algo, rest


def algo_args_mapping(tokens: list[str]) -> dict[str, Any]:
    """``["--algo=repo-d", "--algo.controller=pi", "--algo.controller.kp=0.3"]`` (or the same
    as separate words) -> ``{"name": "repo-d", "controller": {"name": "pi", "kp": "0.3"}}``;
    values stay text until the parts are known."""
    algo, rest = split_algo_args(tokens)
    if rest:
        raise ValueError(f"unexpected {rest[0]!r}: algorithm options look like {OPTION}.KNOB VALUE")
    spec: dict[str, Any] = {}
    for token in algo:
        option, _, value = token.partition("=")
        path = [_key(p) for p in option[len(OPTION) :].split(".")[1:]]
        if not path:
            spec = merge_specs(spec, _whole(value))
        elif len(path) == 1 and path[0] in SETTINGS:
            spec[path[0]] = value
        elif len(path) == 1 and path[0] in PART_REGISTRIES:
            spec = merge_specs(spec, {path[0]: {"name": value}})
        elif len(path) == 2 and path[0] in PART_REGISTRIES:
            spec = merge_specs(spec, {path[0]: {path[1]: value}})
        else:
            raise ValueError(_bad_option(option))
    return spec


def _whole(value: str) -> dict[str, Any]:
    """``--algo NAME`` or ``--algo '{name: ..., ...}'`` (a YAML flow mapping)."""
    text = value.strip()
    if text.startswith("{"):
        loaded = yaml_limits.safe_load(text, f"{OPTION} {value!r}")  # bounded: no alias bombs
        if not isinstance(loaded, dict):
            raise ValueError(f"{OPTION}: cannot read {value!r} as a mapping")
        return loaded
    return {"name": text}


def _bad_option(option: str) -> str:
    return (
        f"{option} is not an algorithm option; they are {OPTION} PRESET, {OPTION}.SETTING "
        f"({', '.join(UPDATE_KNOBS)}), {OPTION}.PART NAME and {OPTION}.PART.KNOB VALUE "
        f"(parts: {', '.join(PART_REGISTRIES)}); `--help` lists every knob"
    )


def _as_part(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


def merge_specs(base: Mapping[str, Any] | str | None, over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: settings replace, a part's knobs merge, and a part named
    anew in ``over`` replaces ``base``'s (whose knobs belonged to the old part)."""
    out = dict(_whole(base) if isinstance(base, str) else base or {})
    for key, value in over.items():
        if key not in PART_REGISTRIES or key not in out:
            out[key] = _as_part(value) if key in PART_REGISTRIES else value
            continue
        old, new = _as_part(out[key]), _as_part(value)
        if not isinstance(old, Mapping) or not isinstance(new, Mapping):
            out[key] = new
        elif "name" in new and new["name"] != old.get("name"):
            out[key] = dict(new)
        else:
            out[key] = {**old, **new}
    return out


def convert_text(name: str, value: Any, hint: Any) -> Any:
    """``value`` converted from text to the type ``hint`` (numbers, booleans, ``none`` for an
    optional knob, a word of a Literal); values that are not text pass through unchanged."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    args = get_args(hint)
    if type(None) in args and text.lower() in ("none", "null"):
        return None
    options = [a for a in args if a is not type(None)] if get_origin(hint) is not Literal else []
    for option in options or [hint]:
        try:
            return _one(text, option)
        except ValueError:
            continue
    raise ValueError(f"{name}: cannot read {value!r} as {type_name(hint)}")


def _one(text: str, hint: Any) -> Any:
    if get_origin(hint) is Literal:
        if text in get_args(hint):
            return text
        raise ValueError
    if hint is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise ValueError
    if hint in (int, float):
        return hint(text)
    return text


def resolve_algorithm(spec: str | Mapping[str, Any] | AlgorithmConfig) -> AlgorithmConfig:
    """The algorithm of a spec whose values may be text (command line) or typed (YAML)."""
    return build_algorithm(spec, coerce=convert_text)


def algorithm_from_options(given: Mapping[str, Any] | str, tokens: list[str]) -> AlgorithmConfig:
    """The algorithm a command was given: a YAML file's ``algo:`` (a preset's name or a mapping)
    with the ``--algo...`` options ``tokens`` over it."""
    return resolve_algorithm(merge_specs(given, algo_args_mapping(tokens)) if tokens else given)


def typed_spec(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """``spec`` with its text values typed (as resolving reads them): what a run's config.yaml
    records, e.g. ``{"name": "repo-d", "controller": {"name": "pi", "kp": 0.3}}``."""
    spec = _whole(spec) if isinstance(spec, str) else dict(spec)
    resolved = algorithm_mapping(resolve_algorithm(spec))
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in PART_REGISTRIES:
            part = resolved[key] or {}
            given = _as_part(value)
            out[key] = {k: part[k] for k in given}
        else:
            out[key] = resolved[key]
    return out


def label(spec: Mapping[str, Any] | str) -> str:
    """The label of a spec: the preset, then its options, e.g.
    ``repo-d --algo.controller pi --algo.controller.kp 0.3`` (a bare preset is its name)."""
    spec = _whole(spec) if isinstance(spec, str) else spec
    words = [str(spec["name"])]
    for key, value in spec.items():
        if key in SETTINGS[1:]:
            words += [f"{OPTION}.{key.replace('_', '-')}", _text(value)]
        elif key in PART_REGISTRIES:
            part = _as_part(value)
            if "name" in part:
                words += [f"{OPTION}.{key}", str(part["name"])]
            for knob, v in part.items():
                if knob != "name":
                    words += [f"{OPTION}.{key}.{knob.replace('_', '-')}", _text(v)]
    return shlex.join(words)


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def parse_label(text: str) -> dict[str, Any]:
    """``"repo-d --algo.controller pi"`` -> ``{"name": "repo-d", "controller": {"name": "pi"}}``
    (values as text); a bare word is a preset."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot read algorithm {text!r}: {exc}") from None
    if not words or words[0].startswith("-"):
        raise ValueError(
            f"cannot read algorithm {text!r}: write a preset, then its options, e.g. "
            f"'repo-d {OPTION}.controller pi'"
        )
    return {"name": words[0], **algo_args_mapping(words[1:])}


def algo_help() -> str:
    """Every preset and every part with its knobs, for ``--help``."""
    lines = [
        "algorithm options:",
        f"  {OPTION} PRESET           one of: {', '.join(ALGORITHMS)}",
        f"  {OPTION}.epochs N, {OPTION}.minibatch-size N|none",
        f"  {OPTION}.is-correction MODE|none  reweight the policy gradient for the sampler/learner",
        f"                          mismatch; MODE one of {', '.join(CORRECTION_MODES[:2])},",
        f"                          {', '.join(CORRECTION_MODES[2:])} (default none: off)",
        f"  {OPTION}.is-clip-min X|none, {OPTION}.is-clip-max X|none",
        "                          the weights' bounds (defaults none and 3.0)",
        f"  {OPTION}.PART NAME        swap a part; {OPTION}.PART.KNOB VALUE sets one of its knobs",
        "                          (a part of yours: module:name)",
    ]
    for kind, registry in PART_REGISTRIES.items():
        lines.append(f"  {kind}{'es' if kind.endswith('s') else 's'}:")
        knobs = {name: _knobs(registry.params_class(name)) for name in registry.names()}
        # knobs the parts with several have in common (the controllers' target, step, range),
        # listed once; a part with one knob or none (fixed) lists its own
        several = [name for name, own in knobs.items() if len(own) > 1]
        shared = set.intersection(*(set(knobs[n]) for n in several)) if len(several) > 1 else set()
        if shared:
            first = knobs[several[0]]
            others = [n for n in knobs if n not in several]
            but = f" but {', '.join(others)}" if others else ""
            lines.append(f"    every {kind}{but}:")
            lines += [_knob_line(kind, k, first[k]) for k in first if k in shared]
        for name, own in knobs.items():
            lines.append(f"    {name}: {_summary(registry.get(name))}")
            mine = own if name not in several else {k: v for k, v in own.items() if k not in shared}
            lines += [_knob_line(kind, k, v) for k, v in mine.items()]
            suggested = getattr(registry.get(name), "controller_knobs", {})
            for controller, values in suggested.items():  # a lever's own controller defaults
                given = ", ".join(f"{k} {v!r}" for k, v in values.items())
                lines.append(f"      with {OPTION}.controller {controller}: {given} unless set")
    return "\n".join(lines)


def _knob_line(kind: str, knob: str, info: tuple[Any, Any, str]) -> str:
    hint, default, doc = info
    flag = f"{OPTION}.{kind}.{knob.replace('_', '-')}"
    return f"      {flag} ({type_name(hint)}, default {default!r}): {doc}"


def _summary(part: Any) -> str:
    doc = (part.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split())


def _knobs(params: type) -> dict[str, tuple[Any, Any, str]]:
    """knob -> (type hint, default, description from the params' docstrings)."""
    hints = typing.get_type_hints(params)
    docs = {
        p.arg_name: " ".join((p.description or "").split())
        for cls in reversed(params.__mro__)
        for p in docstring_parser.parse(cls.__doc__ or "").params
    }
    return {f.name: (hints[f.name], f.default, docs.get(f.name, "")) for f in fields(params)}
