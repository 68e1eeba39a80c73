"""Shared test setup.

Built models are cached under ``ENTROGYM_CACHE`` (default ``~/.cache/entrogym``) so the suite
prepares each one once. GPU-only tests carry ``@pytest.mark.gpu`` and skip cleanly without CUDA.
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (CI has none; run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
