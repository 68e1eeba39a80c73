"""Fixtures the fault tests share: the tiny random Llama on the ``hf`` engine, an agent whose
turns never end by themselves (3 tokens: the cut action is sent to the env), and a guard that
fails a test when a model loads before a refusal."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import Engine, make_engine

MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = make_engine("hf", MODEL, dtype="fp32", max_model_len=256, seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def agent() -> LLMAgent:
    return LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=256, on_turn_budget="step")


@pytest.fixture()
def no_model_loads(monkeypatch) -> Iterator[None]:
    """Any load of model weights fails the test (a refusal must come before it)."""
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the adapter was checked")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    yield
