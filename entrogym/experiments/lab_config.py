"""What the bandit lab runs: its settings and its runs, each a label and a typed algorithm.

Text never reaches here: ``entrogym bandit`` reads a variant such as
``"repo-d --algo.controller pi --algo.controller.kp 0.3"`` into a :class:`LabRun`
(``entrogym.commands.lab_runs``), and the lab keeps the label only to name the run's rows and
table lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from entrogym.algos import ALGORITHMS, AlgorithmConfig, algorithm_mapping
from entrogym.theory.tabular import INITS

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class LabRun:
    """One run of the lab.

    Args:
        label: the name its rows and table lines carry (a preset's name, or the preset
            followed by the options the run sets, e.g. ``repo-d --algo.controller pi``).
        algorithm: the algorithm it trains.
    """

    label: str
    algorithm: AlgorithmConfig

    @property
    def preset(self) -> str:
        return self.algorithm.name

    @property
    def is_variant(self) -> bool:
        """Whether it sets options over its preset (the plot draws it dashed)."""
        return self.label != self.preset


def preset_runs() -> list[LabRun]:
    """Every preset as it is, labelled by its name."""
    return [LabRun(name, algorithm) for name, algorithm in ALGORITHMS.items()]


@dataclass
class LabSettings:
    """The bandit lab's settings other than the algorithms it runs.

    Args:
        seeds: seeds per preset (seed s fixes the arm means, the initial logits and sampling).
        iters: iterations per run.
        n_states: bandit states (one group of samples per state and iteration).
        n_arms: arms per state.
        samples_per_state: K, samples per state and iteration.
        reward_noise: ``bernoulli`` rewards or the arm means themselves.
        init: initial logits (``calibrated`` to the arm means, or another of the INITS).
        calibration: how strongly calibrated initial logits follow the arm means.
        init_noise: noise added to the initial logits.
        optimizer: ``sgd`` or ``adam``.
        lr: learning rate of the tabular logits.
        max_grad_norm: gradient clipping (0 = none).
        max_staleness: K, as the trainer's ``--max-staleness``: iteration i samples with the
            policy after update i - K (0: the current one) and trains on that stale batch, with
            the sampling policy's log-probs as the ratio's denominator (docs/async.md).
    """

    seeds: int = 3
    iters: int = 50
    n_states: int = 32
    n_arms: int = 16
    samples_per_state: int = 8
    reward_noise: str = "bernoulli"
    init: str = "calibrated"
    calibration: float = 2.0
    init_noise: float = 0.5
    optimizer: str = "sgd"
    lr: float = 64.0
    max_grad_norm: float = 0.0
    max_staleness: int = 0

    def settings(self) -> dict[str, Any]:
        """The settings as a mapping (a subclass's own fields left out)."""
        return {f.name: getattr(self, f.name) for f in fields(LabSettings)}

    def validate(self) -> None:
        for name in ("seeds", "iters", "n_states"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_arms < 2 or self.samples_per_state < 2:
            raise ValueError(
                f"n_arms and samples_per_state must be >= 2 (a group needs two samples), "
                f"got {self.n_arms}, {self.samples_per_state}"
            )
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.max_grad_norm < 0:
            raise ValueError(
                f"max_grad_norm must be >= 0 (0 = no clipping), got {self.max_grad_norm}"
            )


@dataclass
class LabConfig(LabSettings):
    """The bandit lab: its settings and the runs it trains, each with every seed.

    Args:
        algos: the runs (default: every preset as it is).
    """

    algos: list[LabRun] = field(default_factory=preset_runs)

    def validate(self) -> None:
        if not self.algos:
            raise ValueError(f"algos: empty list; choose from {', '.join(ALGORITHMS)}")
        super().validate()

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` records: the settings, the labels, and each run's whole
        algorithm (every part with every knob)."""
        return {
            **self.settings(),
            "algos": [run.label for run in self.algos],
            "algorithms": {run.label: algorithm_mapping(run.algorithm) for run in self.algos},
        }
