"""The bandit lab's runs, read from their text into typed ``LabRun``s.

An entry of ``entrogym bandit --algos`` is a preset or a labelled variant in the one spelling
of algorithms: ``"repo-d --algo.controller pi --algo.controller.kp 0.3"``. Lab-wide options
(``--algo.controller pi``) apply to every entry, lever and controller options only to the
entries whose preset has a lever (unless they name the lever); an entry's own options win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from entrogym.algos import ALGORITHMS
from entrogym.commands.algo_text import label, merge_specs, parse_label, resolve_algorithm
from entrogym.experiments.lab_config import LabConfig, LabRun

# Beside the paper-cap presets, `entrogym bandit` runs these variants scaled to the toy, taken
# from the regime map in docs/bandit.md (3-seed sweeps at the lab's defaults, lr 64, 50 iters):
# at lr 64 REPO-R holds entropy only with one optimizer step per iteration, so GRPO runs with
# that same step count too; REPO-D and the bonus hold with a smaller cap than the paper's 10.
# ADAPO has no variant: no clip setting held entropy in this toy (see the regime map).
TOY_VARIANTS = (
    "grpo --algo.epochs 1 --algo.minibatch-size none",
    "repo-r --algo.controller.max 0.5 --algo.epochs 1 --algo.minibatch-size none",
    "repo-d --algo.controller.max 0.5",
    "grpo-entropy-bonus --algo.controller.max 0.2",
)
DEFAULT_ALGOS = (*ALGORITHMS, *TOY_VARIANTS)
LEVER_KEYS = ("lever", "controller")


def entry_label(entry: str) -> str:
    """An entry's label as tables show it (its spelling normalised)."""
    return label(parse_label(entry))


def entry_spec(entry: str, shared: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The algorithm spec of ``entry``: the lab-wide options ``shared`` that apply to it, then
    the entry's own (module doc)."""
    own = parse_label(entry)
    common = dict(shared or {})
    if not _names_lever(common) and not _has_lever(entry):
        common = {k: v for k, v in common.items() if k not in LEVER_KEYS}
    return merge_specs({"name": own["name"], **common}, own)


def lab_run(entry: str, shared: Mapping[str, Any] | None = None) -> LabRun:
    """The run ``entry`` means, labelled by its own options (the lab-wide ones applied)."""
    return LabRun(entry_label(entry), resolve_algorithm(entry_spec(entry, shared)))


def lab_runs(entries: list[str], shared: Mapping[str, Any] | None = None) -> list[LabRun]:
    """The runs of ``entries``; a ValueError names the entry or option that does not read."""
    shared = dict(shared or {})
    if not entries:
        raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
    if "name" in shared:
        raise ValueError(
            "algo: the presets come from algos; give algorithm options without a preset"
        )
    runs = []
    for entry in entries:
        try:
            runs.append(lab_run(entry, shared))
        except ValueError as e:
            raise ValueError(
                f"algos: {entry!r}: {e} (a variant is written "
                "'repo-d --algo.controller pi --algo.controller.kp 0.3')"
            ) from None
    lever_options = set(LEVER_KEYS) & set(shared) and not _names_lever(shared)
    if lever_options and not any(run.algorithm.controller is not None for run in runs):
        # with no lever anywhere, the options were dropped from every entry: nothing used them
        raise ValueError(
            "algo: lever and controller options apply to presets with a lever, and none "
            f"of {', '.join(entries)} has one"
        )
    return runs


def lab_config(
    algos: list[str] | tuple[str, ...] = DEFAULT_ALGOS,
    algo: Mapping[str, Any] | None = None,
    **settings: Any,
) -> LabConfig:
    """The validated ``LabConfig`` of entries ``algos`` with lab-wide options ``algo`` and the
    lab ``settings`` (``iters``, ``lr``, ...)."""
    lab = LabConfig(**settings, algos=lab_runs(list(algos), algo))
    lab.validate()
    return lab


def _names_lever(shared: Mapping[str, Any]) -> bool:
    lever = shared.get("lever")
    return "name" in ({"name": lever} if isinstance(lever, str) else dict(lever or {}))


def _has_lever(entry: str) -> bool:
    return resolve_algorithm(parse_label(entry)).controller is not None
