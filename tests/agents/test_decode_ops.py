"""The static decoder's per-step C++ kernels beside attention (``decode_ops.cpp`` and
``decode_attention_step``) against independent computations: the formulas in fp64, torch's own
ops (which they replace, so that the decoder's math is unchanged), an exact scan of the
cumulative mass for the token draw, and draw frequencies against the probabilities; and the
decoder on them against the decoder on torch's ops."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from lora_policy import randomise_lora_b
from scipy.stats import chisquare

from entrogym import onednn
from entrogym.agents.engines import SamplingParams, decode_kernel
from entrogym.agents.engines.draws import inverse_cdf_draw
from entrogym.agents.engines.sampling_copy import Projection
from entrogym.agents.engines.static_decode import StaticDecoder, rotate
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy

DTYPES = [torch.float32, torch.bfloat16]


def _step_case(dtype: torch.dtype, groups: int = 3, per_group: int = 3, d: int = 64):
    gen = torch.Generator().manual_seed(0)
    b, columns = 5, 40
    qkv = torch.randn(b, (groups * per_group + 2 * groups) * d, generator=gen).to(dtype)
    angles = torch.rand(b, d // 2, generator=gen) * 6
    cos = torch.cat([angles.cos()] * 2, -1).to(dtype)
    sin = torch.cat([angles.sin()] * 2, -1).to(dtype)
    keys_t = torch.randn(b, groups, d, columns, generator=gen).to(dtype)
    values = torch.randn(b, groups, columns, d, generator=gen).to(dtype)
    valid = torch.rand(b, columns, generator=gen) > 0.3
    return qkv, cos, sin, keys_t, values, valid


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("column", [0, 17, 39])
def test_the_attention_step_is_the_decoders_torch_prologue_and_attention(dtype, column):
    """Rotating q and k with ``static_decode.rotate``, writing k (transposed) and v at the
    column, then the attention kernel: the same bits, in the output and in both caches."""
    qkv, cos, sin, keys_t, values, valid = _step_case(dtype)
    valid[:, column] = True
    b, groups, d = len(qkv), values.shape[1], values.shape[-1]
    heads = qkv.shape[1] // d - 2 * groups
    want_k, want_v = keys_t.clone(), values.clone()
    qk, v = qkv.view(b, 1, -1).split([(heads + groups) * d, groups * d], -1)
    qk = rotate(qk.view(b, 1, heads + groups, d), cos[:, None], sin[:, None])
    want_k[..., column : column + 1] = qk[:, :, heads:].permute(0, 2, 3, 1)
    want_v[:, :, column : column + 1] = v.view(b, 1, groups, d).transpose(1, 2)
    q = qk[:, :, :heads].reshape(b, groups, heads // groups, d)
    want = decode_kernel.attention(q, want_k, want_v, valid, column + 1).reshape(b, heads * d)
    got = decode_kernel.attention_step(qkv, cos, sin, keys_t, values, valid, column)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    assert torch.equal(keys_t, want_k) and torch.equal(values, want_v)  # nothing else written


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_rms_norm_is_the_formula_and_torchs(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(24, 576, generator=gen) * 3).to(dtype)
    w = torch.randn(576, generator=gen).to(dtype)
    got = decode_kernel.rms_norm(x, w, 1e-5)
    exact = x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w.double()
    assert got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), exact, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(got, F.rms_norm(x, (576,), w, 1e-5), rtol=1e-6, atol=1e-6)
    else:  # one rounding from fp32: within one bf16 unit of the exact value
        ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp(min=1e-30))) - 7)
        assert bool(((got.double() - exact).abs() <= ulp).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_silu_mul_is_the_formula_and_torchs(dtype):
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(7, 2 * 1000, generator=gen) * 6).to(dtype)  # a tail past 16 lanes
    gate, up = gate_up.double().chunk(2, -1)
    got = decode_kernel.silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (7, 1000)
    torch_ops = F.silu(gate_up[:, :1000]) * gate_up[:, 1000:]
    if dtype == torch.float32:
        exact = gate * torch.sigmoid(gate) * up
        torch.testing.assert_close(got.double(), exact, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got, torch_ops, rtol=2e-6, atol=1e-6)
    else:  # silu rounded to bf16, then the product: torch's two ops, bit for bit
        assert torch.equal(got, torch_ops)


def _scan(row: torch.Tensor, u: float) -> int:
    """The smallest i whose exact cumulative mass exceeds u * total, over exp(x - max) in
    float64 (math.fsum: exact sums)."""
    p = (row.double() - row.max().double()).exp().tolist()
    target, running = u * math.fsum(p), []
    for i, x in enumerate(p):
        running.append(x)
        if math.fsum(running) > target:
            return i
    raise AssertionError("no entry exceeds the target")


@pytest.mark.parametrize("vocab", [37, 256, 3 * 256 + 77])  # a partial block, one, several
def test_the_draw_is_the_exact_scans_index_and_its_log_prob_log_softmax(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(32, vocab, generator=gen) * 4
    uniforms = torch.rand(32, dtype=torch.float64, generator=gen)
    ids, logprobs = decode_kernel.cdf_sample(logits, logits, uniforms)
    assert ids.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert ids.tolist() == [_scan(r, u) for r, u in zip(logits, uniforms.tolist(), strict=True)]
    exact = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, None])[:, 0]
    torch.testing.assert_close(logprobs.double(), exact, rtol=0, atol=2e-6)


def test_the_draw_takes_what_inverse_cdf_draw_takes_from_the_same_stream():
    """With the uniforms drawn as ``inverse_cdf_draw`` draws them (one float64 per row), the
    same ids as that draw over ``softmax``: the fused path samples the unfused path's tokens."""
    logits = torch.randn(24, 49152, generator=torch.Generator().manual_seed(3)) * 3
    for seed in range(3):
        torch.manual_seed(seed)
        want = inverse_cdf_draw(F.softmax(logits, -1))
        torch.manual_seed(seed)
        uniforms = torch.rand(24, dtype=torch.float64)
        assert torch.equal(decode_kernel.cdf_sample(logits, logits, uniforms)[0], want)


def test_processed_scores_are_drawn_and_the_raw_logits_scored():
    """Scores cut by top-k (-inf) are never drawn; the log-prob is the raw logits' log-softmax,
    not the scores'."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(64, 600, generator=gen) * 2
    scores = logits / 0.5
    scores[:, 20:] = -torch.inf
    ids, logprobs = decode_kernel.cdf_sample(scores, logits, torch.rand(64, dtype=torch.float64))
    assert bool((ids < 20).all())
    raw = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, None])[:, 0]
    torch.testing.assert_close(logprobs.double(), raw, rtol=0, atol=2e-6)


def test_the_frequencies_match_the_probabilities():
    p = torch.tensor([0.5, 0.25, 0.0, 0.125, 0.0625, 0.0625, 0.0])
    n = 100_000
    logits = p.log().expand(n, -1).contiguous()  # log 0 = -inf: never drawn
    ids, _ = decode_kernel.cdf_sample(logits, logits, torch.rand(n, dtype=torch.float64))
    counts = torch.bincount(ids, minlength=len(p))
    keep = p > 0
    assert counts[~keep].sum() == 0
    assert chisquare(counts[keep].tolist(), (p[keep] * n).tolist()).pvalue > 1e-3
    uniform = [n / int(keep.sum())] * int(keep.sum())  # a draw ignoring p would fail
    assert chisquare(counts[keep].tolist(), uniform).pvalue < 1e-6


def test_bad_input_is_refused_in_one_line():
    qkv, cos, sin, keys_t, values, valid = _step_case(torch.float32)
    with pytest.raises(RuntimeError, match="column out of range"):
        decode_kernel.attention_step(qkv, cos, sin, keys_t, values, valid, 40)
    with pytest.raises(RuntimeError, match="cos and sin must be"):
        decode_kernel.attention_step(qkv, cos[:, :32], sin[:, :32], keys_t, values, valid, 3)
    with pytest.raises(RuntimeError, match="one dtype"):
        decode_kernel.attention_step(qkv, cos.double(), sin.double(), keys_t, values, valid, 3)
    with pytest.raises(RuntimeError, match="weight"):
        decode_kernel.rms_norm(torch.ones(2, 8), torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="2 I"):
        decode_kernel.silu_mul(torch.ones(2, 7))
    with pytest.raises(RuntimeError, match="float64"):
        decode_kernel.cdf_sample(torch.ones(2, 8), torch.ones(2, 8), torch.rand(2))
    no_mass = torch.full((2, 8), -torch.inf)
    no_mass[0, 3] = 0.0  # one row with mass, one without
    with pytest.raises(RuntimeError, match="a row with no mass"):
        decode_kernel.cdf_sample(no_mass, no_mass, torch.rand(2, dtype=torch.float64))


needs_avx512 = pytest.mark.skipif(
    not decode_kernel.linear_supported(), reason="the streaming linear kernel needs AVX-512"
)


@needs_avx512
def test_the_packed_layout_is_blocks_of_16_output_columns():
    weight = torch.arange(40 * 3, dtype=torch.float32).view(40, 3)  # 40: a partial last block
    packed = decode_kernel.linear_pack(weight)
    assert packed.shape == (3, 3, 16)
    for n in range(40):
        assert torch.equal(packed[n // 16, :, n % 16], weight[n])
    assert not packed[2, :, 8:].any()  # columns past N are zero


@needs_avx512
@pytest.mark.parametrize("rows", [1, 7, 24, 25, 57, 126])  # chunks of 24, partial ones
@pytest.mark.parametrize("n", [48, 100])  # whole blocks of 16, and a partial last one
def test_the_linear_kernel_is_x_w_t_in_fp64(rows, n):
    gen = torch.Generator().manual_seed(rows * n)
    weight, x = torch.randn(n, 576, generator=gen), torch.randn(rows, 576, generator=gen)
    residual = torch.randn(rows, n, generator=gen)
    packed = decode_kernel.linear_pack(weight)
    exact = x.double() @ weight.double().T
    got = decode_kernel.linear(x, packed, n)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=1e-4)
    with_residual = decode_kernel.linear(x, packed, n, residual)
    torch.testing.assert_close(with_residual.double(), exact + residual.double(), rtol=0, atol=1e-4)
    # as exact as torch's own fp32 matmul (one sum of 576 products each)
    torch_error = ((x @ weight.T).double() - exact).abs().max()
    assert (got.double() - exact).abs().max() <= 4 * torch_error + 1e-6


@needs_avx512
def test_the_linear_kernel_refuses_a_weight_packed_for_another_shape():
    packed = decode_kernel.linear_pack(torch.randn(40, 8))
    with pytest.raises(RuntimeError, match="decode_linear_pack's"):
        decode_kernel.linear(torch.randn(2, 8), packed, 64)
    with pytest.raises(RuntimeError, match="residual must be"):
        decode_kernel.linear(torch.randn(2, 8), packed, 40, torch.randn(2, 41))


@needs_avx512
def test_a_weight_packs_with_its_adapter_merged_in_as_peft_merges_it():
    """``linear_pack_into`` of rows stacked at an offset: each block of 16 output columns is
    ``W + scaling * B A`` (peft's merge, in fp64 here), the rows of another module untouched."""
    gen = torch.Generator().manual_seed(6)
    w, b, a = (torch.randn(*shape, generator=gen) for shape in ((32, 40), (32, 4), (4, 40)))
    other = torch.randn(16, 40, generator=gen)
    packed = torch.full((3, 40, 16), float("nan"))
    decode_kernel.linear_pack_into(packed, 0, other)
    decode_kernel.linear_pack_into(packed, 16, w, b, a, 0.5)
    merged = w.double() + 0.5 * b.double() @ a.double()
    unpacked = packed.permute(0, 2, 1).reshape(48, 40)  # block, column, K -> rows of W
    assert torch.equal(unpacked[:16], other)
    torch.testing.assert_close(unpacked[16:].double(), merged, rtol=0, atol=1e-5)
    with pytest.raises(RuntimeError, match="whole blocks of 16"):
        decode_kernel.linear_pack_into(packed, 8, w)


@needs_avx512
def test_an_adapter_free_head_is_packed_once_for_every_version():
    """The decoders of two adapter versions share the packed LM head (no adapter on it) and
    pack their adapted projections each; a head changed in place is packed anew."""
    policy = randomise_lora_b(load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()))
    first = StaticDecoder(policy, policy.active_adapter)
    second = StaticDecoder(randomise_lora_b(policy, 2), policy.active_adapter)
    assert first.head.kernel, "the tiny model's head (49152 wide) is on the streaming kernel"
    assert second.head is first.head
    assert second.layers[0].qkv.weight.data_ptr() != first.layers[0].qkv.weight.data_ptr()
    head = policy.get_base_model().lm_head.weight
    with torch.no_grad():
        head.add_(1.0)
    third = StaticDecoder(policy, policy.active_adapter)
    assert third.head is not first.head
    x = torch.randn(3, head.shape[1])
    torch.testing.assert_close(third.head(x), x @ head.detach().T, rtol=1e-5, atol=1e-5)


LAYOUTS = [
    pytest.param({"packed": False}, id="input-major"),
    pytest.param({"packed": True}, id="onednn"),
    pytest.param({"packed": True, "kernel": True}, id="kernel", marks=needs_avx512),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_projection_computes_and_adds_its_residual(layout):
    if layout["packed"] and not onednn.supported(torch.device("cpu"), torch.float32):
        pytest.skip("this torch build has no oneDNN")
    gen = torch.Generator().manual_seed(5)
    weight, x = torch.randn(96, 64, generator=gen), torch.randn(24, 64, generator=gen)
    residual = torch.randn(24, 96, generator=gen)
    projection = Projection(weight, **layout)
    torch.testing.assert_close(projection(x[None]), (x @ weight.T)[None], rtol=1e-5, atol=1e-5)
    got = projection.add(x, residual)
    torch.testing.assert_close(got, residual + x @ weight.T, rtol=1e-5, atol=1e-5)


PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2


def test_the_decoder_samples_the_same_on_the_kernels_with_the_cdf_draw():
    """fp32, the tiny model, ``static-cdf``'s draw: on the kernels (the fused draw included)
    and on torch's ops, the same tokens under a seed and log-probs equal to rounding."""
    policy = randomise_lora_b(load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()))
    out = {}
    for kernels in (False, True):
        decoder = StaticDecoder(policy, policy.active_adapter, kernels=kernels)
        torch.manual_seed(0)
        params = SamplingParams(max_tokens=24, temperature=0.8, top_k=40)
        out[kernels] = decoder.sample(PROMPTS, params, 24, [], 0, draw=inverse_cdf_draw)
    assert torch.equal(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=1e-5)
    assert len({tuple(row) for row in out[True][0].tolist()}) > 1  # a real sample
