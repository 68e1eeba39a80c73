"""A run of ``entrogym demo`` and ``entrogym sequential``, read from its text into a ``DemoRun``.

A run is a preset, or a labelled variant in the one spelling of algorithms
(``repo-d --algo.controller pi --algo.controller.kp 0.3``), optionally named:
``held=grpo --algo.lever entropy-constraint ...``. Its algorithm is the demo's update
(``DEMO_UPDATE``) under the spec's own options; the presets keep the paper's other values.
"""

from __future__ import annotations

from entrogym.commands.algo_text import (
    label,
    merge_specs,
    parse_label,
    resolve_algorithm,
    typed_spec,
)
from entrogym.experiments.config import DEMO_UPDATE, DemoRun


def split_run(text: str) -> tuple[str, str]:
    """``"held=grpo --algo.lever ..."`` -> ``("held", "grpo --algo.lever ...")``: a ``NAME=``
    prefix (an identifier-like word, hyphens allowed, no spaces) labels the run; a spec without
    one is labelled by its own label (ValueError where it does not parse)."""
    head, sep, rest = text.partition("=")
    name = head.strip()
    if sep and " " not in name and name.replace("-", "_").isidentifier():
        return name, rest.strip()
    return spec_label(text), text


def spec_label(spec: str) -> str:
    """A spec's own label: its preset, then the options it sets with their values typed
    (``repo-r --algo.controller.init 0.05``). Unknown presets, parts and knobs, and values a
    knob does not take, raise ValueError naming them."""
    return label(typed_spec(parse_label(spec)))


def folder_name(spec_label: str) -> str:
    """A run folder's name from a label: the label's words, ``--algo.`` dropped, joined by
    ``_`` with every character a path might not take replaced."""
    text = spec_label.replace("--algo.", "")
    folder = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
    return "_".join(part for part in folder.split("_") if part)


def parse_run(text: str) -> DemoRun:
    """The run ``text`` (``NAME=SPEC`` or a spec) means; a named run's folder is its name.
    ValueError names what does not parse."""
    name, spec = split_run(text)
    own = spec_label(spec)
    algo = resolve_algorithm(merge_specs(DEMO_UPDATE, parse_label(spec)))
    folder = folder_name(own) if name == own else name
    return DemoRun(text, name, folder, spec, folder_name(own), algo)


def run_option(option: str, text: str) -> DemoRun:
    """The run ``text`` given to ``option``; one that does not parse is a ValueError naming
    both (``algos: 'grpo --algo.x 1': ...``)."""
    try:
        return parse_run(text)
    except ValueError as err:
        raise ValueError(f"{option}: {text!r}: {err}") from None
