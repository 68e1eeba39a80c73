"""The weight versions the engine samples with, each published as an adapter folder.

Every iteration's new weights are written as ``adapters/vNNNNNN`` (one folder per version:
engines reload a new path), and the folders no engine reads any more are pruned. With
``--max-staleness K`` the K versions before the current one stay sampleable: the learner keeps
their weights (``WeightVersions``) and a checkpoint saves them, so that a resumed async run
publishes them again. Under ``torchrun`` publishing is a collective; rank 0 writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from entrogym.train.devices import distributed
from entrogym.train.folder.safety import adapter_folder, prune_adapters, write_error
from entrogym.train.learner.policy import save_adapter
from entrogym.train.learner.versions import Weights, WeightVersions


@dataclass(frozen=True)
class StalenessBudget:
    """What ``--max-staleness K`` keeps (``entrogym.train.sampler.pipeline``): batches are
    sampled by the current weight version or one of the ``K`` before it."""

    max_staleness: int

    @property
    def versions(self) -> int:
        """Weight versions sampled with at once: the learner keeps their weights, the engine
        holds their adapters (``max_loras``)."""
        return self.max_staleness + 1

    @property
    def adapter_folders(self) -> int:
        """Adapter folders kept on disk: the sampling versions and the one before."""
        return self.versions + 1


class AdapterVersions:
    """The published adapter folders of one run and, with ``max_staleness`` K >= 1, the kept
    weights of the versions a stale batch may come from (``versions``; None for a synchronous
    run). :meth:`start` it once the learner's policy exists."""

    def __init__(
        self, max_staleness: int, run_dir: Path, ranks: distributed.Ranks, base_model: str
    ) -> None:
        """``base_model``: the model the adapters are for, recorded in each folder."""
        self.budget = StalenessBudget(max_staleness)
        self.run_dir, self.ranks, self.base_model = run_dir, ranks, base_model
        self.adapter: Path | None = None  # the current weights' adapter folder (engine input)
        self.versions: WeightVersions | None = None

    def start(self, policy: torch.nn.Module) -> None:
        """The policy whose weights are published, and the kept versions' store."""
        self.policy = policy
        if self.budget.max_staleness:  # the versions a stale batch may come from
            self.versions = WeightVersions(policy, keep=self.budget.versions)

    def publish(self, version: int) -> None:
        """Write the current weights as ``adapters/vNNNNNN`` for the rollouts, evaluation and
        servers that follow, and drop the versions no engine reads any more (checkpoints hold
        their own copy). With ``max_staleness`` K the K versions before stay, and the learner
        keeps their weights."""
        weights = distributed.gathered_adapter(self.policy, self.ranks)  # collective under torchrun
        folder = adapter_folder(self.run_dir, version)
        if self.versions is not None:
            self.versions.record(version)
        if self.ranks.main:
            try:
                save_adapter(self.policy, folder, weights, base_model=self.base_model)
                # disk stays bounded however long the run
                prune_adapters(self.run_dir, version, keep=self.budget.adapter_folders)
            except OSError as exc:
                raise write_error(exc, str(folder)) from exc
        self.adapter = folder

    def publish_older(self, start: int) -> None:
        """A resumed async run: the adapter folders of the versions its next batches are
        sampled by, from the weights its checkpoint kept."""
        if self.versions is None:
            return
        older = [v for v in self.versions.versions() if v < start]
        for version, weights in self.versions.full(older).items():  # collective under torchrun
            if self.ranks.main:
                folder = adapter_folder(self.run_dir, version)
                save_adapter(self.policy, folder, weights, base_model=self.base_model)

    def to_save(self, it: int) -> dict[int, Weights] | None:
        """The weights of the versions the batches after iteration ``it`` are sampled by, for
        its checkpoint (a collective under torchrun); None for a synchronous run."""
        if self.versions is None:
            return None
        return self.versions.full([v for v in self.versions.versions() if v <= it])

    def load(self, saved: dict[Any, Weights] | None) -> None:
        """Keep the sampling versions' weights a checkpoint saved."""
        if self.versions is not None and saved:
            self.versions.load({int(v): w for v, w in saved.items()})

    def oldest(self, start: int) -> int:
        """The oldest version a batch from iteration ``start`` on may be sampled by."""
        return min(self.versions.versions()) if self.versions is not None else start
