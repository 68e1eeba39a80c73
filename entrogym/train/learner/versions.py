"""The trainable (LoRA) weights of recent versions, so that a stale batch is scored under the
policy that sampled it (``--max-staleness``; ``entrogym.train.sampler.pipeline``).

The importance ratio's denominator must be the sampling policy: with ``K >= 1`` the batch of
iteration ``i`` was sampled by version ``i - K`` while the learner holds version ``i``. The
learner keeps copies of the trainable weights of the last ``K + 1`` versions (LoRA only: a few
MB each; the frozen base is shared by all versions) and scores a stale batch's old log-probs
with the sampling version's weights swapped in, in fp32, exactly as it scores its own.

Under ``torchrun`` each rank keeps its own shards; :meth:`WeightVersions.full` gathers whole
tensors for a checkpoint (a collective) and :meth:`WeightVersions.load` shards them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

Weights = dict[str, torch.Tensor]


class WeightVersions:
    """Copies of ``model``'s trainable parameters for up to ``keep`` versions."""

    def __init__(self, model: torch.nn.Module, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.model, self.keep = model, keep
        self._saved: dict[int, Weights] = {}

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def versions(self) -> list[int]:
        return sorted(self._saved)

    def record(self, version: int) -> None:
        """Copy the model's current trainable weights as ``version`` (dropping the oldest
        copies beyond ``keep``)."""
        self._saved[version] = {n: p.detach().clone() for n, p in self._params().items()}
        for old in sorted(self._saved)[: -self.keep]:
            del self._saved[old]

    @contextlib.contextmanager
    def weights_of(self, version: int) -> Iterator[None]:
        """The model holds ``version``'s weights inside the block, its own again after it."""
        if version not in self._saved:
            raise KeyError(f"weight version {version} is not kept (kept: {self.versions()})")
        params = self._params()
        own = {n: p.detach().clone() for n, p in params.items()}
        try:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(self._saved[version][name])
            yield
        finally:
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(own[name])

    def full(self, versions: list[int]) -> dict[int, Weights]:
        """Whole CPU tensors of ``versions`` (under FSDP2 a collective: every rank calls it)."""
        out = {}
        for version in versions:
            out[version] = {
                name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()
                for name, t in self._saved[version].items()
            }
        return out

    def load(self, saved: dict[int, Weights]) -> None:
        """Keep the whole tensors ``saved`` (from :meth:`full`), sharded like the model's own
        parameters."""
        params = self._params()
        for version, weights in saved.items():
            missing = sorted(set(params) - set(weights))
            if missing:
                raise ValueError(f"saved weight version {version} lacks {missing[0]}")
            self._saved[version] = {n: _like(weights[n], p) for n, p in params.items()}
        for old in sorted(self._saved)[: -self.keep]:
            del self._saved[old]


def _like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``param``: sharded the same way under FSDP2, else a plain copy."""
    full = full.to(dtype=param.dtype)
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return full.to(param.device).clone()
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full.to(mesh.device_type), mesh, param.placements)
