"""The named algorithms with the paper's defaults (paper-notes "Algorithms"; Sec. 2, 5, 6).

A preset is data: which advantage estimator, how many epochs and minibatches, where to clip,
and which entropy control. The trainer and the bandit lab read these fields and call the
functions in ``advantages``, ``losses`` and ``entropy``; nothing here computes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ENTROPY_CONTROLS = (None, "repo-r", "repo-d", "adapo", "entropy-bonus")


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
        entropy_control: ``None``, ``"repo-r"``, ``"repo-d"``, ``"adapo"`` or ``"entropy-bonus"``.
        zeta_init, zeta_min, zeta_max: the ZetaController for REPO's zeta / the bonus's beta.
        eps_high_min, eps_high_max, eps_high_up, eps_high_down: ADAPO's EpsHighController.
    """

    name: str
    advantage: str = "rloo"
    epochs: int = 2
    minibatch_size: int | None = 128
    eps_low: float | None = 0.2
    eps_high: float | None = 0.2
    ratio_level: str = "token"
    aggregation: str = "sequence-mean"
    entropy_control: str | None = None
    zeta_init: float = 1e-3
    zeta_min: float = 1e-4
    zeta_max: float = 0.05
    eps_high_min: float = 0.2
    eps_high_max: float = 0.32
    eps_high_up: float = 1.05
    eps_high_down: float = 0.95

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
        if self.entropy_control not in ENTROPY_CONTROLS:
            raise ValueError(
                f"entropy_control must be one of {ENTROPY_CONTROLS}, got {self.entropy_control!r}"
            )

    def with_overrides(self, **changes: object) -> AlgorithmConfig:
        """A copy with some fields changed (unknown field names raise ``ValueError``)."""
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise ValueError(
                f"unknown algorithm fields {sorted(unknown)}; known: {sorted(self.__dataclass_fields__)}"
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
        "repo-r", advantage="grpo", entropy_control="repo-r", zeta_min=1e-4, zeta_max=0.05
    ),
    "repo-d": AlgorithmConfig(
        "repo-d", advantage="grpo", entropy_control="repo-d", zeta_min=1e-3, zeta_max=10.0
    ),
    "adapo": AlgorithmConfig(
        "adapo", advantage="rloo", eps_low=0.2, eps_high=0.28, entropy_control="adapo"
    ),
    # beta plays REPO-D's zeta (the appendix shows REPO-D == an entropy bonus with that
    # coefficient), so it takes REPO-D's controller range.
    "grpo-entropy-bonus": AlgorithmConfig(
        "grpo-entropy-bonus",
        advantage="grpo",
        entropy_control="entropy-bonus",
        zeta_min=1e-3,
        zeta_max=10.0,
    ),
}


def get_algorithm(name: str, **overrides: object) -> AlgorithmConfig:
    """The preset called ``name``, optionally with fields overridden."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known presets: {', '.join(ALGORITHMS)}")
    preset = ALGORITHMS[name]
    return preset.with_overrides(**overrides) if overrides else preset
