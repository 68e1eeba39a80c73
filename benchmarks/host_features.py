"""What the benchmarks ran on: the CPU (model, cores, the instruction sets the kernels choose
by: AVX2, AVX-512, AVX512-BF16, AMX) and the kernel each phase of an iteration takes there.

The choices are made by the same functions the code calls when it runs: the ``hf`` engine's
static decoder by ``decode_kernel.plan`` (its projections on entrogym's fp32 streaming kernel,
oneDNN or torch's matmul; its other step ops on the C++ kernels or torch's), the learner's
frozen linears, LoRA layers and LM head by ``onednn.supported`` (oneDNN, else torch's MKL
sgemm). bf16 matmuls are native only with AVX512-BF16 or AMX (``entrogym.dtypes``); oneDNN
takes AMX's tiles where the CPU has them.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

# CPU flags (/proc/cpuinfo) the kernels' speed depends on, by the name the report gives them.
FEATURES = {
    "avx2": "avx2",
    "avx512": "avx512f",
    "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
}


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's model name (``lscpu``'s), or the platform's processor string."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_features(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU model, its logical cores, which of :data:`FEATURES` it has, and the ISA torch's
    own CPU kernels dispatch to."""
    from entrogym.dtypes import cpu_flags

    flags = cpu_flags(cpuinfo)
    return {
        "cpu_model": cpu_model(cpuinfo),
        "logical_cpus": os.cpu_count(),
        "features": {name: flag in flags for name, flag in FEATURES.items()},
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": torch.backends.mkldnn.is_available(),
    }


def phase_kernels(model_dir: str, sampler_dtype: str, learner_dtype: str = "fp32") -> dict:
    """The kernel each phase takes for the model in ``model_dir`` on this CPU: generation
    (the ``hf`` engine's static decoder in ``sampler_dtype``) and the learner's scoring,
    forward and backward (``learner_dtype``: the paper's log-probs are fp32)."""
    from transformers import AutoConfig

    from entrogym import onednn
    from entrogym.agents.engines import decode_kernel
    from entrogym.dtypes import torch_dtype

    config = AutoConfig.from_pretrained(model_dir)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    cpu = torch.device("cpu")
    sampler = torch_dtype(sampler_dtype)
    plan = decode_kernel.plan(cpu, sampler, heads // kv_heads, head_dim)
    learner = torch_dtype(learner_dtype)
    matmul = "oneDNN linear" if onednn.supported(cpu, learner) else "torch matmul (MKL sgemm)"
    return {
        "generation": {"dtype": sampler_dtype, **decode_kernel.plan_names(plan)},
        "learner": {"dtype": learner_dtype, "frozen_linears_lora_lm_head": matmul},
    }


def describe(host: dict[str, Any], kernels: dict[str, Any] | None = None) -> str:
    """One line for people: the CPU, its features and the phases' kernels."""
    have = [name for name, present in host["features"].items() if present]
    line = f"host: {host['cpu_model']}, {host['logical_cpus']} cpus, {' '.join(have) or 'none'}"
    for phase, choice in (kernels or {}).items():
        parts = ", ".join(f"{k} {v}" for k, v in choice.items())
        line += f"; {phase}: {parts}"
    return line
