"""The training recipe (``trainer``) and the parts it drives: the run (``run``, ``folder/``), the
sampler (``sampler/``), the learner (``learner/``, ``devices/``) and evaluation (``evaluation/``);
``docs/architecture.md`` draws the layout.

The public face is loaded lazily (PEP 562), so ``entrogym.train.config`` stays cheap to import
for the commands' fail-fast checks::

    from entrogym.train import Trainer, TrainConfig, train
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "entrogym.train.config",
    "Trainer": "entrogym.train.trainer",
    "TrainingStopped": "entrogym.train.trainer",
    "train": "entrogym.train.trainer",
    "collate_episodes": "entrogym.train.batch",
    "evaluate_policy": "entrogym.train.evaluation.evaluate",
    "sequence_logprobs": "entrogym.train.learner.logprobs",
    "sequence_logprobs_and_entropy": "entrogym.train.learner.logprobs",
    "sampler_mismatch": "entrogym.train.learner.mismatch",
    "sampler_entropy_gap": "entrogym.train.learner.mismatch",
    "load_policy": "entrogym.train.learner.policy",
    "MetricsLogger": "entrogym.train.folder.metrics",
    "read_metrics": "entrogym.train.folder.metrics",
    "latest_checkpoint": "entrogym.train.folder.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'entrogym.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
