"""A bf16 sampler on a CPU without native bf16 is refused in one line naming fp32."""

from __future__ import annotations

import pytest

from entrogym import dtypes
from entrogym.agents.config import AgentConfig
from entrogym.dtypes import cpu_has_bf16

X86_AMX = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
X86_OLD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_flags_read_from_cpuinfo():
    assert cpu_has_bf16(X86_AMX) is True
    assert cpu_has_bf16(ARM_BF16) is True
    assert cpu_has_bf16(X86_OLD) is False
    assert cpu_has_bf16("model name: something\n") is None  # no flags: unknown, not refused


def test_this_machine_reads_the_same_as_torch():
    """An independent reading: torch's own CPU capability probes agree with /proc/cpuinfo."""
    import torch

    mine = cpu_has_bf16()
    if mine is None:
        pytest.skip("no /proc/cpuinfo flags on this machine")
    assert mine == (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def test_bf16_hf_sampler_refused_on_a_cpu_without_it(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr("entrogym.agents.config.cpu_has_bf16", lambda: False)
    with pytest.raises(ValueError, match="pass --engine-dtype fp32") as err:
        AgentConfig(engine="hf", engine_dtype="bf16")
    assert "\n" not in str(err.value)
    AgentConfig(engine="hf", engine_dtype="fp32")  # fp32 is always fine
    # a remote server computes elsewhere: nothing to refuse here
    AgentConfig(engine="vllm-server", engine_urls=["http://127.0.0.1:1"], engine_dtype="bf16")


def test_the_train_command_refuses_it_before_any_model_loads(monkeypatch, capsys):
    import sys

    from entrogym.cli import main

    monkeypatch.setattr("entrogym.agents.config.cpu_has_bf16", lambda: False)
    for name in [m for m in sys.modules if m.startswith(("transformers", "peft"))]:
        monkeypatch.delitem(sys.modules, name)
    rc = main(["train", "--engine", "hf", "--engine-dtype", "bf16", "--out", "/nonexistent/x"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--engine-dtype fp32" in err
    assert "transformers" not in sys.modules
