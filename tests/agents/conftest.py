"""The tiny model's ``hf`` engine and a stepping agent, shared by the rollout tests (a test
module that needs other settings defines its own ``engine`` or ``agent``)."""

from __future__ import annotations

import pytest

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import make_engine

MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def engine():
    eng = make_engine("hf", MODEL, dtype="fp32", max_model_len=1024, seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def agent():
    return LLMAgent.from_model(MODEL, max_turn_tokens=3, max_context=1024, on_turn_budget="step")
