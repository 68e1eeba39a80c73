"""The ``hf`` engine's ``decode="static"`` path (merged LoRA weights, static KV cache) samples
what ``generate`` samples: the same tokens under a seed and the same log-probs, with and
without an adapter; a new adapter version is merged anew and loading order leaks nothing."""

from __future__ import annotations

import copy
import logging
import os
from unittest import mock

import pytest
import torch
from lora_policy import randomise_lora_b

from entrogym import onednn
from entrogym.agents.engines import SamplingParams, make_engine, static_decode
from entrogym.agents.engines.static_decode import (
    StaticDecoder,
    rms_norm,
    rotate,
    sdpa_step,
    shared_prefix,
    step_attention,
)
from entrogym.models import resolve_model
from entrogym.train.learner.policy import LoraSettings, load_policy, save_adapter

# duplicated prompts, as a rollout's K samples per task are (the static path prefills each once)
PROMPTS = [[1, 5, 9, 13], [1, 7, 2], [1, 4, 4, 8, 3, 11, 12]] * 2
SETTINGS = [
    SamplingParams(temperature=1.0, max_tokens=10),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=10),
    SamplingParams(temperature=0.0, max_tokens=10),
]


def _engine(decode: str, model: str = "tiny-random-llama"):
    return make_engine("hf", model, dtype="fp32", max_model_len=64, decode=decode)


def _sample(decode: str, params, adapter=None, history=(), seed: int = 0, prompts=PROMPTS):
    """Completions of ``prompts`` in a seeded scope, after sampling with each of ``history``."""
    with _engine(decode) as engine:
        for used in history:
            engine.generate(prompts, SETTINGS[0], adapter=used)
        with engine.seeded(seed):
            return engine.generate(prompts, params, adapter=adapter)


def _save(policy, folder, seed: int) -> str:
    randomise_lora_b(policy, seed)  # a non-zero adapter: LoRA changes the outputs
    save_adapter(policy, folder)
    return str(folder)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("adapters")
    policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
    return [_save(policy, root / f"a{seed}", seed) for seed in (1, 2)]


def _assert_same(static, generated) -> None:
    assert [c.token_ids for c in static] == [c.token_ids for c in generated]
    assert [c.finish_reason for c in static] == [c.finish_reason for c in generated]
    for s, g in zip(static, generated, strict=True):
        assert s.logprobs == pytest.approx(g.logprobs, abs=1e-5)


@pytest.mark.parametrize("params", SETTINGS, ids=["t1", "t0.7-topk-topp", "greedy"])
@pytest.mark.parametrize("with_adapter", [False, True], ids=["base", "lora"])
def test_static_samples_what_generate_samples(adapters, params, with_adapter):
    adapter = adapters[0] if with_adapter else None
    generated = _sample("generate", params, adapter)
    static = _sample("static", params, adapter)
    _assert_same(static, generated)
    assert len({tuple(c.token_ids) for c in static}) > 1  # rows differ: a real sample


# a system prompt's worth of shared opening, then prompts of different lengths, one repeated
SHARED = [1, 5, 9, 13, 2, 6, 6, 3]
PREFIXED = [SHARED + [7], SHARED + [4, 4, 8, 3, 11], SHARED + [2, 9], SHARED + [7]]


@pytest.mark.parametrize("decode", ["static", "static-cdf"])
def test_a_shared_prefix_prefilled_once_samples_what_generate_samples(adapters, decode):
    """Prompts that share their opening (prefilled once, as one row, then copied to every
    row): the same tokens as ``generate`` under a seed (``static``), and for ``static-cdf``,
    whose draw is not generate's, the same tokens as its own path without the sharing."""
    reference = "generate" if decode == "static" else decode
    if decode == "static":
        expected = _sample(reference, SETTINGS[0], adapters[0], prompts=PREFIXED)
    else:
        with mock.patch.object(static_decode, "shared_prefix", return_value=0):
            expected = _sample(reference, SETTINGS[0], adapters[0], prompts=PREFIXED)
    shared = _sample(decode, SETTINGS[0], adapters[0], prompts=PREFIXED)
    _assert_same(shared, expected)


def test_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([tuple(p) for p in PREFIXED[:3]]) == len(SHARED)
    assert shared_prefix([(1, 2, 3), (1, 2, 3, 4)]) == 2  # the shorter keeps its last token
    assert shared_prefix([(1, 2), (3, 2)]) == 0
    assert shared_prefix([(1, 2, 3)]) == 0  # one prompt: nothing to share


def test_rms_norm_and_rotate_compute_llamas_modules():
    """The decoder's fused norm and its joint rotation of queries and keys compute what
    ``transformers``' LlamaRMSNorm and ``apply_rotary_pos_emb`` compute."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    norm = LlamaRMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=gen))
    x = torch.randn(3, 5, 32, generator=gen)
    torch.testing.assert_close(rms_norm(x, norm), norm(x), rtol=1e-6, atol=1e-6)
    q, k = torch.randn(3, 5, 4, 16, generator=gen), torch.randn(3, 5, 2, 16, generator=gen)
    angles = torch.rand(3, 5, 8, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rq, rk = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    joint = rotate(torch.cat([q, k], 2), cos, sin)
    torch.testing.assert_close(joint[:, :, :4], rq.transpose(1, 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(joint[:, :, 4:], rk.transpose(1, 2), rtol=0, atol=1e-6)


def test_the_adapter_changes_the_static_samples(adapters):
    base = _sample("static", SETTINGS[0])
    lora = _sample("static", SETTINGS[0], adapters[0])
    assert [c.logprobs for c in base] != [c.logprobs for c in lora]


def test_static_stops_where_generate_stops(adapters):
    free = _sample("generate", SETTINGS[0], adapters[0])
    # a token some rows sample mid-way: those rows stop there, the others run on
    stop = free[0].token_ids[3]
    params = SamplingParams(temperature=1.0, max_tokens=10, stop_token_ids=(stop,))
    generated = _sample("generate", params, adapters[0])
    static = _sample("static", params, adapters[0])
    _assert_same(static, generated)
    assert "stop" in [c.finish_reason for c in static]
    assert static[0].token_ids[-1] == stop


def test_a_new_adapter_version_is_merged_anew(tmp_path):
    policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
    folder = _save(policy, tmp_path / "adapter", 1)
    with _engine("static") as engine:
        with engine.seeded(0):
            first = engine.generate(PROMPTS, SETTINGS[0], adapter=folder)
        _save(policy, folder, 2)  # the trainer publishes a new version in the same folder
        stat = os.stat(folder + "/adapter_model.safetensors")
        os.utime(folder + "/adapter_model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
        with engine.seeded(0):
            second = engine.generate(PROMPTS, SETTINGS[0], adapter=folder)
    assert [c.logprobs for c in first] != [c.logprobs for c in second]
    fresh = _sample("generate", SETTINGS[0], folder)
    _assert_same(second, fresh)


def test_loading_order_does_not_leak(adapters):
    first, second = adapters
    fresh = _sample("static", SETTINGS[0], second)
    after_others = _sample("static", SETTINGS[0], second, history=[first, None, second, first])
    assert [c.token_ids for c in after_others] == [c.token_ids for c in fresh]
    assert [c.logprobs for c in after_others] == [c.logprobs for c in fresh]
    base_after = _sample("static", SETTINGS[0], None, history=[first, second])
    base_fresh = _sample("static", SETTINGS[0], None)
    assert [c.logprobs for c in base_after] == [c.logprobs for c in base_fresh]


def test_merged_cache_keeps_max_loras_versions(adapters):
    with make_engine(
        "hf", "tiny-random-llama", dtype="fp32", max_model_len=64, decode="static", max_loras=1
    ) as engine:
        for adapter in (*adapters, None):
            engine.generate(PROMPTS[:1], SETTINGS[0], adapter=adapter)
        assert len(engine._decoders) == 2  # the newest adapter and the base


def test_an_old_version_is_dropped_before_the_new_one_is_merged(adapters, monkeypatch):
    """The peak holds max_loras merged copies: none is built while max_loras others live."""
    from entrogym.agents.engines import hf

    live_at_build = []
    built = hf.StaticDecoder

    def counting(net, adapter):
        live_at_build.append(len([k for k in engine._decoders if k is not None]))
        return built(net, adapter)

    monkeypatch.setattr(hf, "StaticDecoder", counting)
    with make_engine(
        "hf", "tiny-random-llama", dtype="fp32", max_model_len=64, decode="static", max_loras=1
    ) as engine:
        for adapter in (*adapters, adapters[0]):
            engine.generate(PROMPTS[:1], SETTINGS[0], adapter=adapter)
    assert live_at_build == [0, 0, 0]


def test_released_caches_are_rebuilt_and_sample_the_same(adapters):
    """``release_caches`` drops every merged copy; the next generate merges again and samples
    what an engine that never released samples."""
    kept = _sample("static", SETTINGS[0], adapters[0], history=[adapters[0]])
    with _engine("static") as engine:
        engine.generate(PROMPTS, SETTINGS[0], adapter=adapters[0])
        engine.generate(PROMPTS[:1], SETTINGS[0])  # the base's decoder too
        assert len(engine._decoders) == 2
        engine.release_caches()
        assert engine._decoders == {}
        with engine.seeded(0):
            released = engine.generate(PROMPTS, SETTINGS[0], adapter=adapters[0])
        assert list(engine._decoders) != []
    assert [c.token_ids for c in released] == [c.token_ids for c in kept]
    assert [c.logprobs for c in released] == [c.logprobs for c in kept]


def test_an_unsupported_model_falls_back_to_generate(caplog):
    with caplog.at_level(logging.WARNING):
        engine = _engine("static", "tiny-random-qwen3")
    with engine:
        assert engine.decode == "generate"
        out = engine.generate(PROMPTS[:2], SETTINGS[0])
    assert "does not support" in caplog.text
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in out)


def test_a_bad_decode_name_is_rejected_before_loading():
    with pytest.raises(ValueError, match="decode must be one of"):
        make_engine("hf", "tiny-random-llama", decode="fast")


def _draw_after(decode: str) -> torch.Tensor:
    with _engine(decode) as engine:  # starting seeds torch's global stream with the engine's seed
        engine.generate(PROMPTS, SETTINGS[0])
    return torch.rand(3)


def test_static_decoding_moves_the_global_stream_as_generate_does():
    assert torch.equal(_draw_after("static"), _draw_after("generate"))


@pytest.mark.parametrize("packed", [False, True], ids=["input-major", "onednn"])
def test_merged_projections_compute_peft_merge(packed):
    """Each projection of the sampling copy computes ``x @ W.T`` for peft's own merge
    (``merge_and_unload``) of the same adapter; unpacked, it is stored transposed ([in, out],
    contiguous); and the model the decoder was built from is left as it was."""
    if packed and not onednn.supported(torch.device("cpu"), torch.float32):
        pytest.skip("this torch build has no oneDNN")
    policy = randomise_lora_b(load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()))
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    decoder = StaticDecoder(policy, policy.active_adapter, packed=packed)
    merged = copy.deepcopy(policy).merge_and_unload()
    gen = torch.Generator().manual_seed(0)
    for layer, block in zip(decoder.layers, merged.model.layers, strict=True):
        attn, mlp = block.self_attn, block.mlp
        expected = {
            "qkv": torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            "o": attn.o_proj.weight,
            "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            "down": mlp.down_proj.weight,
        }
        for name, weight in expected.items():
            projection = getattr(layer, name)
            assert projection.packed == packed
            if not packed:
                stored = projection.weight
                assert stored.is_contiguous() and stored.shape == weight.T.shape, name
                torch.testing.assert_close(stored, weight.T, rtol=0, atol=1e-6)
            rows = torch.randn(5, 1, weight.shape[1], generator=gen)
            with torch.no_grad():
                torch.testing.assert_close(projection(rows), rows @ weight.T, rtol=1e-5, atol=1e-5)
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_onednn_packing_samples_what_the_plain_copy_samples(adapters, dtype):
    """The oneDNN-packed sampling copy draws the same tokens under a seed as the input-major
    one, with the same log-probs to rounding."""
    if not onednn.supported(torch.device("cpu"), dtype):
        pytest.skip(f"this CPU or torch build cannot pack {dtype} for oneDNN")
    policy = randomise_lora_b(load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()))
    policy = policy.to(dtype)
    out = {}
    for packed in (False, True):
        decoder = StaticDecoder(policy, policy.active_adapter, packed=packed)
        torch.manual_seed(0)
        out[packed] = decoder.sample(PROMPTS, SETTINGS[0], 10, [], 0)
    assert torch.equal(out[True][0], out[False][0])
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2  # bf16 rounds each product's sum
    torch.testing.assert_close(out[True][1], out[False][1], rtol=0, atol=tolerance)


def test_step_attention_is_masked_softmax_attention():
    """The decode step's fp32 attention against the formula in fp64, one row and query at a
    time, and against ``scaled_dot_product_attention``; masked keys get no weight."""
    gen = torch.Generator().manual_seed(0)
    b, groups, rows, keys, d = 3, 2, 3, 7, 8
    q = torch.randn(b, groups, rows, d, generator=gen)
    k = torch.randn(b, groups, keys, d, generator=gen)
    v = torch.randn(b, groups, keys, d, generator=gen)
    mask = torch.ones(b, 1, 1, keys, dtype=torch.bool)
    mask[0, ..., :4] = False  # a left-padded row
    mask[2, ..., 5] = False
    want = torch.empty(b, groups, rows, d, dtype=torch.float64)
    for i in range(b):
        seen = mask[i, 0, 0]
        for g in range(groups):
            for r in range(rows):
                w = (k[i, g].double() @ q[i, g, r].double()) / d**0.5
                w = torch.where(seen, w, -torch.inf).softmax(-1)
                assert float(w[~seen].abs().sum()) == 0.0
                want[i, g, r] = w @ v[i, g].double()
    got = step_attention(q, k, v, mask)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, sdpa_step(q, k, v, mask), rtol=1e-5, atol=1e-6)
    # a masked key's value changes nothing
    v2 = v.clone()
    v2[0, :, 1] += 100.0
    torch.testing.assert_close(step_attention(q, k, v2, mask), got, rtol=0, atol=0)


def test_the_decoder_takes_step_attention_in_fp32_on_cpu_only():
    policy = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings())
    assert StaticDecoder(policy, policy.active_adapter).step_attention is step_attention
    bf16 = load_policy(resolve_model("tiny-random-llama"), lora=LoraSettings()).to(torch.bfloat16)
    assert StaticDecoder(bf16, bf16.active_adapter).step_attention is sdpa_step
