"""The named algorithms with the paper's defaults (paper Sec. 2 "Preliminaries", Sec. 5, appendix "Training").

A preset is data: which advantage estimator, how many epochs and minibatches, where to clip,
and which registered entropy control (``entrogym.algos.controls``). The trainer and the bandit
lab hand it to ``policy_update``; nothing here computes anything.

A preset's knobs (what ``get_algorithm(name, **knobs)`` may change) are the common fields plus
the knobs of its control: ``zeta_max`` is a knob of ``repo-r``, not of ``grpo``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace
from typing import Literal, get_args

from entrogym.algos.controls import control_class

# How REPO's shaping log-prob is centred: the paper's raw log pi, or the exact log pi + H(s).
RepoCentering = Literal["raw", "exact"]
REPO_CENTERINGS: tuple[str, ...] = get_args(RepoCentering)

# The knobs every preset has; a control adds its own (``EntropyControl.knobs``).
COMMON_KNOBS = (
    "advantage",
    "epochs",
    "minibatch_size",
    "eps_low",
    "eps_high",
    "ratio_level",
    "aggregation",
)


@dataclass(frozen=True)
class AlgorithmConfig:
    """One policy-gradient algorithm.

    Attributes:
        name: preset name.
        advantage: ``"rloo"`` (leave-one-out) or ``"grpo"`` (group mean/std).
        epochs: passes over each iteration's experience (1 = strictly on-policy RLOO).
        minibatch_size: trajectories per optimizer step; ``None`` = all experience in one step.
            The paper uses 128 on AppWorld and 256 on AIME.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; ``None`` = no clip on that side.
        ratio_level: ``"token"`` (PPO-style) or ``"sequence"`` (GSPO's geometric mean ratio).
        aggregation: ``"sequence-mean"`` (the paper's 1/|tau| form) or ``"token-mean"`` (DAPO's).
        control: a registered entropy control: ``"none"``, ``"repo-r"``, ``"repo-d"``,
            ``"adapo"``, ``"entropy-bonus"`` or one added with ``register_control``.
        zeta_init, zeta_min, zeta_max: the ZetaController for REPO's zeta / the bonus's beta
            (knobs of ``repo-r``, ``repo-d`` and ``entropy-bonus``).
        zeta_factor: the controller's multiplicative step per iteration. The paper's listing
            doubles and halves (2.0, the default); a smaller factor (> 1) moves zeta more
            gently, and 1.0 holds it at ``zeta_init`` (a fixed coefficient). A project knob,
            not a paper setting (docs/demo.md).
        eps_high_min, eps_high_max, eps_high_up, eps_high_down: ADAPO's EpsHighController
            (knobs of ``adapo``).
        repo_centering: REPO's shaping log-prob: ``"raw"`` log pi (the paper's
            implementation) or ``"exact"`` log pi + H(s) with the exact per-token entropy
            (Sec. 5), which makes the scorer compute entropies (knob of ``repo-r`` and
            ``repo-d``).
    """

    name: str
    advantage: str = "rloo"
    epochs: int = 2
    minibatch_size: int | None = 128
    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    ratio_level: str = "token"
    aggregation: str = "sequence-mean"
    control: str = "none"
    zeta_init: float = 1e-3
    zeta_min: float = 1e-4
    zeta_max: float = 0.05
    zeta_factor: float = 2.0
    eps_high_min: float = 0.2
    eps_high_max: float = 0.32
    eps_high_up: float = 1.05
    eps_high_down: float = 0.95
    repo_centering: RepoCentering = "raw"

    def __post_init__(self) -> None:
        if self.advantage not in ("rloo", "grpo"):
            raise ValueError(f"advantage must be 'rloo' or 'grpo', got {self.advantage!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.minibatch_size is not None and self.minibatch_size < 1:
            raise ValueError(f"minibatch_size must be >= 1 or None, got {self.minibatch_size}")
        if self.ratio_level not in ("token", "sequence"):
            raise ValueError(f"ratio_level must be 'token' or 'sequence', got {self.ratio_level!r}")
        if self.aggregation not in ("sequence-mean", "token-mean"):
            raise ValueError(
                f"aggregation must be 'sequence-mean' or 'token-mean', got {self.aggregation!r}"
            )
        if self.repo_centering not in REPO_CENTERINGS:
            raise ValueError(
                f"repo_centering must be one of {', '.join(REPO_CENTERINGS)}, "
                f"got {self.repo_centering!r}"
            )
        # Building the control checks its knobs' values (e.g. zeta_min <= zeta_max).
        control_class(self.control)(self)
        if self.repo_centering != "raw" and "repo_centering" not in self.knobs:
            raise ValueError(
                f"repo_centering={self.repo_centering!r} does not apply to control "
                f"{self.control!r}; presets that accept it: {', '.join(presets_with('repo_centering'))}"
            )

    @property
    def knobs(self) -> tuple[str, ...]:
        """The fields a user may change: the common ones plus its control's."""
        return COMMON_KNOBS + control_class(self.control).knobs

    def with_overrides(self, **changes: object) -> AlgorithmConfig:
        """A copy with some knobs changed; a name that is not one of ``knobs`` raises."""
        names = {f.name for f in fields(self)}
        for key in changes:
            if key not in self.knobs:
                what = "does not apply to" if key in names else "is not a knob of"
                accepting = presets_with(key)
                where = f"presets that accept it: {', '.join(accepting)}; " if accepting else ""
                raise ValueError(
                    f"algo: {key!r} {what} preset {self.name!r} (control {self.control!r}); "
                    f"{where}its knobs: {', '.join(self.knobs)}"
                )
        return replace(self, **changes)


ALGORITHMS: dict[str, AlgorithmConfig] = {
    # Strictly on-policy: one epoch, one minibatch holding all experience, nothing to clip.
    "rloo": AlgorithmConfig(
        "rloo", advantage="rloo", epochs=1, minibatch_size=None, eps_low=None, eps_high=None
    ),
    "grpo": AlgorithmConfig("grpo", advantage="grpo"),
    "loop": AlgorithmConfig("loop", advantage="rloo"),
    "dapo": AlgorithmConfig("dapo", advantage="rloo", eps_low=0.2, eps_high=0.28),
    "gspo": AlgorithmConfig(
        "gspo", advantage="rloo", eps_low=3e-4, eps_high=4e-4, ratio_level="sequence"
    ),
    "repo-r": AlgorithmConfig(
        "repo-r", advantage="grpo", control="repo-r", zeta_min=1e-4, zeta_max=0.05
    ),
    "repo-d": AlgorithmConfig(
        "repo-d", advantage="grpo", control="repo-d", zeta_min=1e-3, zeta_max=10.0
    ),
    "adapo": AlgorithmConfig(
        "adapo", advantage="rloo", eps_low=0.2, eps_high=0.28, control="adapo"
    ),
    # beta plays REPO-D's zeta (the appendix shows REPO-D == an entropy bonus with that
    # coefficient), so it takes REPO-D's controller range.
    "grpo-entropy-bonus": AlgorithmConfig(
        "grpo-entropy-bonus",
        advantage="grpo",
        control="entropy-bonus",
        zeta_min=1e-3,
        zeta_max=10.0,
    ),
}


def _preset(name: str) -> AlgorithmConfig:
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known presets: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def get_algorithm(name: str, **overrides: object) -> AlgorithmConfig:
    """The preset called ``name``, optionally with some of its knobs changed."""
    preset = _preset(name)
    return preset.with_overrides(**overrides) if overrides else preset


def preset_knobs(name: str) -> tuple[str, ...]:
    """The knobs of preset ``name``: the common ones plus its control's own."""
    return _preset(name).knobs


def presets_with(knob: str) -> list[str]:
    """The presets that have ``knob`` (e.g. ``repo_centering``: repo-r, repo-d)."""
    return [name for name, preset in ALGORITHMS.items() if knob in preset.knobs]


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
