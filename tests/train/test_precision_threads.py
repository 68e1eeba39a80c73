"""Native low-precision checks on CPU, the fp32 LM head under a bf16 body, and apply_threads."""

from __future__ import annotations

import os

import pytest
import torch

from entrogym import dtypes
from entrogym.dtypes import cpu_flags, cpu_has_native
from entrogym.train.devices.precision import apply_threads, check_device_dtype
from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import apply_lora, load_base_model

NATIVE_BF16 = cpu_has_native(torch.bfloat16)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nflags : amx_tile\n")
    flags = cpu_flags(info)
    assert {"avx512_bf16", "amx_tile", "fpu"} <= flags
    assert cpu_has_native(torch.bfloat16, flags)
    assert not cpu_has_native(torch.float16, flags)
    assert cpu_has_native(torch.float32, frozenset({"fpu"}))
    assert not cpu_has_native(torch.bfloat16, frozenset({"fpu", "avx2"}))
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_bf16_on_a_cpu_without_it_says_so_and_suggests_fp32(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset({"fpu", "avx2"}))
    with pytest.raises(ValueError, match="no native bf16.*AVX512_BF16.*use dtype='fp32'"):
        check_device_dtype("cpu", torch.bfloat16)
    with pytest.raises(ValueError, match="no native fp16"):
        load_base_model("tiny-random-llama", dtype="fp16")
    assert check_device_dtype("cpu", torch.float32) == torch.device("cpu")


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has no native bf16")
@pytest.mark.parametrize("name", ["tiny-random-llama", "tiny-random-qwen3"])
def test_bf16_body_keeps_an_fp32_head(name):
    fp32 = load_base_model(name)
    model = load_base_model(name, dtype="bf16", head_dtype="fp32")
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight.dtype == torch.float32 and embed.weight.dtype == torch.bfloat16
    # the checkpoint's fp32 values, not bf16-rounded ones (llama's head is tied to embed)
    assert torch.equal(head.weight, fp32.get_output_embeddings().weight)
    ids = torch.randint(0, 49152, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # plain forward: hidden upcast into the fp32 head
    assert logits.dtype == torch.float32
    lora = apply_lora(model, seed=0)
    assert lora.get_output_embeddings().weight.dtype == torch.float32
    out, ref = sequence_logprobs(lora, ids), sequence_logprobs(fp32, ids)
    assert out.dtype == torch.float32 and 0 < (out - ref).abs().max() < 0.05


def test_apply_threads_sets_and_validates():
    before = torch.get_num_threads()
    try:
        assert apply_threads(1) == before
        assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        for bad in (0, -1, (os.cpu_count() or 1) + 1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="threads must be an integer from 1 to"):
                apply_threads(bad)
    finally:
        torch.set_num_threads(before)
