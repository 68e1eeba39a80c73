"""The demo's rollout settings: the ``hf`` engine samples with the ``static-cdf`` decode path,
and another engine (``--engine vllm``) gets a config it accepts instead of a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrogym.agents.engines import resolve_engine_kind
from entrogym.algos import get_algorithm
from entrogym.experiments import AGENT, demo_agent, demo_config


def test_the_demo_samples_with_the_inverse_cdf_path() -> None:
    assert AGENT.engine == "hf" and AGENT.engine_decode == "static-cdf"
    assert demo_agent().engine_kwargs()["decode"] == "static-cdf"


@pytest.mark.parametrize("engine", ["vllm", "vllm-server"])
def test_another_engine_samples_its_own_way(engine: str, tmp_path: Path) -> None:
    agent = demo_agent(engine)
    assert agent.engine == engine and agent.engine_decode == "generate"
    cfg = demo_config(get_algorithm("grpo"), tmp_path, 2, 1e-4, eval_tasks=0, engine=engine)
    assert cfg.engine == engine and cfg.engine_decode == "generate"


def test_auto_keeps_the_decode_path_where_it_means_hf() -> None:
    resolved = resolve_engine_kind("auto")  # hf without CUDA, vllm with it
    agent = demo_agent("auto")
    assert agent.engine == resolved
    assert agent.engine_decode == ("static-cdf" if resolved == "hf" else "generate")


def test_the_other_settings_are_the_demos() -> None:
    # fp16, not bf16: an hf sampler's bf16 is refused on a CPU without native bf16
    # (tests/agents/test_engine_dtype.py), and this must pass on any CPU
    agent = demo_agent("hf", "tiny-random-llama", "fp16")
    assert (agent.model, agent.engine_dtype) == ("tiny-random-llama", "fp16")
    assert agent.max_response_tokens == AGENT.max_response_tokens
    assert agent.system_prompt == AGENT.system_prompt
