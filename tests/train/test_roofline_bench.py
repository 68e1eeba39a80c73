"""benchmarks/roofline.py: its parameter, FLOP and byte counts against independent ones (torch's
own parameter count, ``FlopCounterMode`` on a real decode step, the KV cache's tensors)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import roofline  # noqa: E402
from tiny_llama import tiny_llama_config  # noqa: E402

BATCH, PROMPT = 3, 7


def _model(config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config._attn_implementation = "eager"  # plain matmuls, which FlopCounterMode counts
    return AutoModelForCausalLM.from_config(config).eval()


def _linear_weights(model) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("tied", [False, True])
def test_weights_are_torchs_count_of_the_linear_layers(tied):
    model = _model(tiny_llama_config(tie_word_embeddings=tied))
    shape = roofline.DecodeShape.from_config(model.config)
    assert shape.weights == _linear_weights(model)
    embed = model.get_input_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters())
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert shape.weights == body - norms - (0 if tied else embed)  # the lookup is no matmul


def test_a_head_dim_apart_from_hidden_over_heads_is_read():
    from transformers import Qwen3Config

    config = Qwen3Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         hidden_size=32, head_dim=16, intermediate_size=64, vocab_size=256)  # fmt: skip
    model = _model(config)
    shape = roofline.DecodeShape.from_config(config)
    assert (shape.q_width, shape.kv_width) == (64, 32)
    assert shape.weights == _linear_weights(model)


def _decode_step(model, prompt_len: int) -> tuple[float, int]:
    """FLOPs of one decode step after a prompt of ``prompt_len``, and its KV cache's bytes."""
    ids = torch.randint(0, model.config.vocab_size, (BATCH, prompt_len))
    with torch.no_grad():
        past = model(ids, use_cache=True).past_key_values
        step = torch.randint(0, model.config.vocab_size, (BATCH, 1))
        with FlopCounterMode(display=False) as counter:
            out = model(step, past_key_values=past, use_cache=True)
    cache = out.past_key_values
    kv_bytes = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    return counter.get_total_flops(), kv_bytes


def test_flops_and_bytes_of_one_decode_step_match_a_real_one():
    model = _model(tiny_llama_config())
    shape = roofline.DecodeShape.from_config(model.config)
    short, kv_short = _decode_step(model, PROMPT)
    long, kv_long = _decode_step(model, PROMPT + 5)
    context = PROMPT + 1  # the step's own key is attended too
    # attention: exact, from the difference of two contexts (the weight term cancels)
    expected = roofline.decode_step_flops(shape, BATCH, context + 5)
    expected -= roofline.decode_step_flops(shape, BATCH, context)
    assert long - short == expected
    # the whole step: the rotary embedding's tiny matmul is the only uncounted work
    assert roofline.decode_step_flops(shape, BATCH, context) == pytest.approx(short, rel=1e-3)
    # bytes: the weights once plus every row's cached keys and values (fp32 here)
    weight_bytes = sum(m.weight.nbytes for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert roofline.decode_step_bytes(shape, BATCH, context, 4) == weight_bytes + kv_short
    assert roofline.decode_step_bytes(shape, BATCH, context + 5, 4) == weight_bytes + kv_long


def test_bounds_and_fraction_follow_from_the_rates():
    shape = roofline.DecodeShape(weights=1000, layers=2, q_width=8, kv_width=4, hidden=8,
                                 intermediate=16)  # fmt: skip
    rates = {"matmul_gflops": 1.0, "read_gb_s": 2.0}
    b = roofline.bounds(shape, batch=4, context=10, itemsize=2, rates=rates)
    assert b["flops_per_step"] == 2 * 4 * 1000 + 4 * 4 * 2 * 8 * 10
    assert b["bytes_per_step"] == (1000 + 2 * 4 * 2 * 4 * 10) * 2
    assert b["flop_bound_tokens_per_s"] == round(4 * 1e9 / b["flops_per_step"], 1)
    assert b["byte_bound_tokens_per_s"] == round(4 * 2e9 / b["bytes_per_step"], 1)
    low = min(b["flop_bound_tokens_per_s"], b["byte_bound_tokens_per_s"])
    assert roofline.roofline_fraction(low / 2, b) == 0.5


def test_measured_rates_are_positive():
    shape = roofline.DecodeShape.from_config(tiny_llama_config())
    assert roofline.matmul_rate(torch.float32, 4, shape.hidden, shape.intermediate) > 0
    assert roofline.read_rate(gib=1 / 64) > 0


def test_a_config_without_llama_fields_is_refused_in_one_line():
    with pytest.raises(ValueError, match="Llama-style model config"):
        roofline.DecodeShape.from_config(object())
