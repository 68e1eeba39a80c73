"""One tiny Llama config for the tests that build their own model folder (the built-in
``tiny-random-llama`` is another, shared one: entrogym.models)."""

from __future__ import annotations

from typing import Any


def tiny_llama_config(**overrides: Any) -> Any:
    """A 2-layer LlamaConfig of width 32 with grouped-query attention; ``overrides`` change any
    field (a test that needs SmolLM2's vocabulary passes ``vocab_size=49152``)."""
    from transformers import LlamaConfig

    fields = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 32, "intermediate_size": 64, "vocab_size": 256}  # fmt: skip
    return LlamaConfig(**(fields | overrides))
