"""``TrainState``: where a run stands between iterations, as a checkpoint saves and restores it.

The weights, the optimizer, the loss scaler and the RNG states are saved beside it
(``entrogym.train.folder.checkpoint``); this is the rest: the counters the loop carries from one
iteration to the next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TrainState:
    """Args:
    iteration: the last completed iteration (-1: none yet); the run goes on at ``start``.
    cumulative_entropy: sum of the iterations' entropies so far (the paper's Fig. 1 axis).
    bad_steps: optimizer steps skipped for non-finite losses or gradients so far.
    best: the best eval ``pass@1`` so far (-1: no evaluation yet).
    control: the entropy control's own state (``EntropyControl.state_dict``).
    probe_states: ``estimator probe``'s fixed states, the target probe's batches
        (``control_feed.states_to_dict``); empty for other estimators.
    metrics_rows: complete rows of ``metrics.jsonl`` that belong to these iterations.
    algo: the preset's name (a resume checks it).
    evaluation_owed: a stop came between ``iteration``'s update and its due held-out
        evaluation, which a resume runs before it goes on.
    """

    iteration: int = -1
    cumulative_entropy: float = 0.0
    bad_steps: int = 0
    best: float = -1.0
    control: dict[str, Any] = field(default_factory=dict)
    probe_states: list[dict[str, Any]] = field(default_factory=list)
    metrics_rows: int = 0
    algo: str = ""
    evaluation_owed: bool = False

    @property
    def start(self) -> int:
        """The next iteration to run."""
        return self.iteration + 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict a checkpoint stores."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainState:
        """From a checkpoint's dict; keys this version does not know are ignored and missing
        ones take their defaults, so checkpoints of older versions still resume."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
