"""``engine: auto`` (the default): vLLM where CUDA is available, ``hf`` on CPU."""

from __future__ import annotations

import torch

from entrogym.agents.config import AgentConfig
from entrogym.agents.engines import CPU_ENGINE, make_engine, resolve_engine_kind


def test_auto_resolves_by_device_and_a_config_records_the_resolved_kind() -> None:
    expected = "vllm" if torch.cuda.is_available() else CPU_ENGINE
    assert resolve_engine_kind("auto") == expected
    assert resolve_engine_kind("vllm") == "vllm" and resolve_engine_kind("hf") == "hf"
    assert AgentConfig().engine == expected
    assert AgentConfig(engine_urls=["http://127.0.0.1:8000"]).engine == "vllm-server"
    assert AgentConfig(engine="vllm").engine == "vllm"  # an explicit kind is kept


def test_make_engine_auto_starts_the_resolved_engine() -> None:
    engine = make_engine("auto", "tiny-random-llama", dtype="fp32", max_model_len=64)
    try:
        assert engine.kind == resolve_engine_kind("auto")
    finally:
        engine.close()
