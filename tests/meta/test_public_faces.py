"""Each layer's public face resolves: every name in ``__all__`` imports."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    "package", ["entrogym.algos", "entrogym.agents", "entrogym.train", "entrogym.experiments"]
)
def test_every_public_name_imports(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_the_documented_import_works() -> None:
    from entrogym.train import TrainConfig, Trainer, train

    assert callable(train) and Trainer.__name__ == "Trainer"
    assert TrainConfig().algo.name == "repo-r"
