"""The static decoder's fused attention kernel (``decode_attention.cpp``) against masked softmax
attention computed in fp64 one (row, head, query) at a time, and the decoder with it against the
decoder without it. The kernel is built here (a C++ compiler and ninja are part of the dev
setup), so a build that fails fails these tests instead of skipping them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from lora_policy import randomise_lora_b

from entrogym.agents.engines import decode_kernel
from entrogym.agents.engines.static_decode import StaticDecoder, step_attention
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy


def _reference(q, k, v, valid, end) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) over the attended keys) v in fp64, loop by loop."""
    b, groups, rows, d = q.shape
    out = torch.empty(b, groups, rows, d, dtype=torch.float64)
    for i in range(b):
        seen = valid[i, :end]
        for g in range(groups):
            keys, values = k[i, g, :end].double(), v[i, g, :end].double()
            for r in range(rows):
                w = keys @ q[i, g, r].double() / d**0.5
                w = torch.where(seen, w, -torch.inf).softmax(-1)
                out[i, g, r] = w @ values
    return out


def _case(rows: int, d: int, columns: int, dtype: torch.dtype, seed: int = 0, scale: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    b, groups = 4, 3
    q = (torch.randn(b, groups, rows, d, generator=gen) * scale).to(dtype)
    k = (torch.randn(b, groups, columns, d, generator=gen) * scale).to(dtype)
    v = torch.randn(b, groups, columns, d, generator=gen).to(dtype)
    valid = torch.ones(b, columns, dtype=torch.bool)
    valid[0, :5] = False  # left padding
    valid[1, :1] = False
    valid[2, 3::4] = False  # holes
    return q, k, v, valid


def _kernel(q, k, v, valid, end):
    return decode_kernel.attention(q, k.transpose(-1, -2).contiguous(), v, valid, end)


def test_the_kernel_builds_here():
    assert decode_kernel.module() is not None
    assert decode_kernel.supports(torch.device("cpu"), torch.float32, 3, 64)
    assert not decode_kernel.supports(torch.device("cpu"), torch.float32, 3, 48)  # not compiled
    assert not decode_kernel.supports(torch.device("cpu"), torch.float16, 3, 64)


@pytest.mark.parametrize(("rows", "d"), [(3, 64), (2, 32), (1, 128), (8, 64)])
@pytest.mark.parametrize("end", [6, 16, 37, 40])  # partial and whole blocks of 16 keys
def test_fp32_kernel_is_masked_softmax_attention(rows, d, end):
    q, k, v, valid = _case(rows, d, 40, torch.float32)
    got = _kernel(q, k, v, valid, end)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got.double(), _reference(q, k, v, valid, end), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("end", [9, 33])
def test_bf16_kernel_rounds_only_its_output(end):
    """From bf16 inputs the kernel computes in fp32 and rounds once, to bf16: within half a
    bf16 unit (plus fp32's error) of the exact result from the same inputs."""
    q, k, v, valid = _case(3, 64, 33, torch.bfloat16)
    got = _kernel(q, k, v, valid, end)
    assert got.dtype == torch.bfloat16
    want = _reference(q, k, v, valid, end)
    ulp = 2.0 ** (torch.floor(torch.log2(want.abs().clamp(min=1e-30))) - 7)
    assert bool(((got.double() - want).abs() <= 0.5 * ulp + 1e-6).all())


def test_masked_and_unwritten_keys_get_no_weight():
    """Keys not attended, and cache columns past ``end``, may hold anything, even scores that
    would overflow exp: they change nothing and make no NaN."""
    q, k, v, valid = _case(3, 64, 48, torch.float32)
    end = 30
    got = _kernel(q, k, v, valid, end)
    k2, v2 = k.clone(), v.clone()
    k2[0, :, :5] = 1e4  # row 0's padding: huge scores
    v2[0, :, :5] = 1e4
    k2[:, :, end:] = float("inf")  # never written
    v2[:, :, end:] = float("nan")
    again = _kernel(q, k2, v2, valid, end)
    assert torch.isfinite(again).all()
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    torch.testing.assert_close(got.double(), _reference(q, k, v, valid, end), rtol=1e-5, atol=2e-6)


def test_a_peaked_softmax_is_as_exact_as_torchs():
    """Scores tens apart (a near one-hot softmax): fp32 rounds the scores themselves, so the
    kernel is held to torch's own fp32 attention's error against fp64, not to a fixed one."""
    q, k, v, valid = _case(3, 64, 20, torch.float32, scale=3.0)
    want = _reference(q, k, v, valid, 20)
    mask = valid[:, None, None, :20]
    torch_error = (step_attention(q, k[:, :, :20], v[:, :, :20], mask).double() - want).abs().max()
    kernel_error = (_kernel(q, k, v, valid, 20).double() - want).abs().max()
    assert kernel_error <= 2 * torch_error + 1e-7


def test_threads_do_not_change_the_result():
    q, k, v, valid = _case(3, 64, 40, torch.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _kernel(q, k, v, valid, 40)
        torch.set_num_threads(2)
        two = _kernel(q, k, v, valid, 40)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)  # one (row, head) is one thread's work


@pytest.mark.parametrize(("rows", "d"), sorted(decode_kernel.SHAPES))
def test_every_shape_it_claims_is_compiled(rows, d):
    """``SHAPES`` repeats the source's list of compiled shapes: each one runs."""
    q, k, v, valid = _case(rows, d, 17, torch.float32)
    got = _kernel(q, k, v, valid, 17)
    torch.testing.assert_close(got.double(), _reference(q, k, v, valid, 17), rtol=1e-5, atol=2e-6)


def test_bad_input_is_refused_in_one_line():
    q, k, v, valid = _case(3, 64, 16, torch.float32)
    with pytest.raises(RuntimeError, match="end out of range"):
        _kernel(q, k, v, valid, 17)
    with pytest.raises(RuntimeError, match="valid must be bool"):
        _kernel(q, k, v, valid.float(), 8)
    with pytest.raises(RuntimeError, match="unsupported dtype or shape"):
        _kernel(*_case(3, 48, 16, torch.float32), 8)


PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2


def _decoders(dtype: torch.dtype) -> dict[bool, StaticDecoder]:
    policy = randomise_lora_b(load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()))
    policy = policy.to(dtype)
    return {
        fused: StaticDecoder(policy, policy.active_adapter, kernels=fused)
        for fused in (False, True)
    }


def test_the_decoder_samples_the_same_with_the_kernel():
    """fp32, the tiny model (2 query rows per kv head, 32-wide heads): with the kernel and with
    torch's attention, the same tokens under a seed and log-probs equal to rounding."""
    from entrogym.agents.engines import SamplingParams

    out = {}
    for fused, decoder in _decoders(torch.float32).items():
        assert decoder.kernels is fused
        torch.manual_seed(0)
        out[fused] = decoder.sample(PROMPTS, SamplingParams(max_tokens=24), 24, [], 0)
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=1e-5)


def test_bf16_decode_steps_match_torchs_ops():
    """bf16: the same teacher-forced decode steps on the kernels and on torch's ops (SDPA) give
    logits equal to bf16's rounding (sampled tokens are not compared: one rounding apart, a
    draw can differ, and where it does depends on the CPU's bf16 kernels)."""
    logits = {}
    for fused, decoder in _decoders(torch.bfloat16).items():
        width, steps = max(len(p) for p in PROMPTS), 6
        first, prompt_columns = decoder._prefill(PROMPTS, [None] * len(PROMPTS), 0, steps)
        valid = torch.zeros(len(PROMPTS), width + steps, dtype=torch.bool)
        valid[:, :width] = prompt_columns
        lengths = torch.tensor([len(p) for p in PROMPTS])
        rows = [first]
        for step in range(steps - 1):
            column = width + step
            valid[:, column] = True
            token = torch.full((len(PROMPTS),), 3 + step)
            rows.append(decoder._step(token, lengths + step, valid, column))
        logits[fused] = torch.stack(rows, 1)
    assert logits[True].dtype == torch.float32
    scale = logits[False].abs().max()
    torch.testing.assert_close(logits[True], logits[False], rtol=0, atol=0.05 * float(scale))


def test_the_decoder_takes_the_kernel_on_cpu_by_default(monkeypatch):
    policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
    assert StaticDecoder(policy, policy.active_adapter).kernels is True
    monkeypatch.setenv("ENTROGYM_DECODE_KERNEL", "0")
    assert StaticDecoder(policy, policy.active_adapter).kernels is False


def test_a_first_build_says_so_once_where_nothing_logs_info(monkeypatch, tmp_path, caplog):
    """The minute a first build takes is announced at WARNING (an application that configures
    no logging shows only warnings); loading a kernel already built says nothing."""
    import torch.utils.cpp_extension as cpp_extension

    def fake_load(name, build_directory, **kwargs):
        Path(build_directory, f"{name}.so").touch()  # what a build leaves
        Path(build_directory, "decode_ops.o").touch()
        return object()

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    with caplog.at_level(logging.WARNING):
        decode_kernel._build(tmp_path, "k")
        decode_kernel._build(tmp_path, "k")
    said = [r for r in caplog.records if "building the decode kernels" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING


def test_a_kernel_that_does_not_build_falls_back_with_one_warning(monkeypatch, tmp_path, caplog):
    def broken(folder, key):
        raise RuntimeError("Error building extension 'x'\nninja: build stopped: subcommand failed.")

    monkeypatch.setenv("ENTROGYM_CACHE", str(tmp_path))
    monkeypatch.setattr(decode_kernel, "_build", broken)
    decode_kernel.module.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert decode_kernel.module() is None
            assert not decode_kernel.supports(torch.device("cpu"), torch.float32, 3, 64)
        warnings = [r for r in caplog.records if "could not be built" in r.getMessage()]
        assert len(warnings) == 1 and "subcommand failed" in warnings[0].getMessage()
        policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
        assert StaticDecoder(policy, policy.active_adapter).kernels is False
    finally:
        decode_kernel.module.cache_clear()
