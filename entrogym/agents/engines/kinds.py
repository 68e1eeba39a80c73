"""The names engines are chosen by: engine kinds and the ``hf`` engine's decode paths.

Its own module, below the package's ``__init__`` and every engine, so that an engine that
checks a name (``hf.py`` checks ``decode``) imports it without importing the package that
imports the engine (the import circle ``tests/meta/test_layers.py`` forbids)."""

from __future__ import annotations

import typing
from typing import Literal

# The one source of truth for engine kinds (configs and command lines import it).
EngineKind = Literal["auto", "vllm", "vllm-server", "hf"]
ENGINE_KINDS: tuple[str, ...] = typing.get_args(EngineKind)
# How the ``hf`` engine samples (``HFEngine(decode=...)``, ``--engine-decode``).
DecodePath = Literal["generate", "static", "static-cdf"]
DECODE_PATHS: tuple[str, ...] = typing.get_args(DecodePath)
