"""The fused LoRA layer (entrogym.train.learner.lora_kernel): its forward and gradients are the
LoRA formula's (checked against float64 autograd of y = x W^T + s x A^T B^T), a policy built with
it computes what peft's own layers compute, and it hands every case it does not cover to peft."""

from __future__ import annotations

import copy

import pytest
import torch
from lora_policy import randomise_lora_b
from peft.tuners.lora import Linear as PeftLoraLinear
from tiny_llama import tiny_llama_config

from entrogym import onednn
from entrogym.train.learner import lora_kernel
from entrogym.train.learner.lora_kernel import FusedLoraLinear, use_fused_lora
from entrogym.train.learner.policy import LoraSettings, apply_lora, load_policy

CPU = torch.device("cpu")
DTYPES = {"fp32": (torch.float32, 2e-5), "bf16": (torch.bfloat16, 3e-2)}


def _needs(dtype: torch.dtype) -> None:
    if not onednn.supported(CPU, dtype):
        pytest.skip(f"oneDNN's linear does not run in {dtype} here")


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize("scaling", [2.0, 0.75])
def test_function_is_the_lora_formula_with_its_gradients(name, scaling):
    dtype, tol = DTYPES[name]
    _needs(dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 24, generator=gen, dtype=torch.float64)
    weight = torch.randn(40, 24, generator=gen, dtype=torch.float64) / 5
    a = torch.randn(4, 24, generator=gen, dtype=torch.float64) / 5
    b = torch.randn(40, 4, generator=gen, dtype=torch.float64) / 2
    upstream = torch.randn(9, 40, generator=gen, dtype=torch.float64)
    # inputs rounded to the tested dtype, so both sides start from the same values
    x, weight, a, b, upstream = (t.to(dtype).double() for t in (x, weight, a, b, upstream))

    # independent: float64 autograd of the formula written out
    ref_in = [t.clone().requires_grad_() for t in (x, a, b)]
    ref = ref_in[0] @ weight.T + scaling * (ref_in[0] @ ref_in[1].T) @ ref_in[2].T
    (ref * upstream).sum().backward()

    got_in = [t.to(dtype).requires_grad_() for t in (x, a, b)]
    got = lora_kernel._LoraLinearFunction.apply(
        got_in[0], weight.to(dtype), got_in[1], got_in[2], scaling
    )
    (got * upstream.to(dtype)).sum().backward()
    assert got.dtype == dtype
    scale = ref.detach().abs().max()
    torch.testing.assert_close(got.double(), ref.detach(), rtol=tol, atol=tol * scale)
    for g, r in zip(got_in, ref_in, strict=True):
        torch.testing.assert_close(g.grad.double(), r.grad, rtol=tol, atol=tol * r.grad.abs().max())


def test_no_input_gradient_where_the_input_needs_none():
    _needs(torch.float32)
    x, weight = torch.randn(5, 8), torch.randn(6, 8)
    a, b = torch.randn(2, 8, requires_grad=True), torch.randn(6, 2, requires_grad=True)
    lora_kernel._LoraLinearFunction.apply(x, weight, a, b, 2.0).sum().backward()
    assert x.grad is None and a.grad is not None and b.grad is not None


def _tiny_policies() -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same LoRA policy twice: peft's layers, and the fused ones over oneDNN's base."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    net = LlamaForCausalLM(tiny_llama_config())
    peft_model = randomise_lora_b(apply_lora(net, LoraSettings(r=4, alpha=8), seed=0))
    fused = copy.deepcopy(peft_model)
    onednn.use_for_frozen_linears(fused)
    assert use_fused_lora(fused) == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    return peft_model, fused


def _loss_and_grads(model, ids) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    (logits.log_softmax(-1)[..., 0]).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


def test_policy_computes_what_peft_computes():
    _needs(torch.float32)
    peft_model, fused = _tiny_policies()
    ids = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(2))
    calls = []
    original = lora_kernel._LoraLinearFunction.apply
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lora_kernel._LoraLinearFunction, "apply",
                   lambda *a: calls.append(1) or original(*a))  # fmt: skip
        got, got_grads = _loss_and_grads(fused, ids)
    assert len(calls) == 14  # every adapted layer took the fused path
    want, want_grads = _loss_and_grads(peft_model, ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == 28
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("case", ["dropout", "merged", "disabled", "base-not-onednn"])
def test_other_cases_go_to_peft(case, monkeypatch):
    _needs(torch.float32)
    peft_model, fused = _tiny_policies()
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    layer = next(m for m in fused.modules() if isinstance(m, FusedLoraLinear))
    if case == "dropout":
        for model in (peft_model, fused):
            for m in model.modules():
                if isinstance(m, PeftLoraLinear):
                    m.lora_dropout["default"] = torch.nn.Dropout(0.5)
            model.eval()  # dropout off, so both compute the same, through peft's forward
    elif case == "merged":
        for model in (peft_model, fused):
            for m in model.modules():
                if isinstance(m, PeftLoraLinear):
                    m.merge()
    elif case == "base-not-onednn":
        layer.base_layer.__class__ = torch.nn.Linear  # not oneDNN's: peft's path
    monkeypatch.setattr(lora_kernel._LoraLinearFunction, "apply",
                        lambda *a: pytest.fail("the fused path ran"))  # fmt: skip
    if case == "base-not-onednn":
        x = torch.randn(4, layer.in_features)
        torch.testing.assert_close(layer(x), PeftLoraLinear.forward(layer, x))
        return
    with torch.no_grad():
        if case == "disabled":
            with fused.disable_adapter(), peft_model.disable_adapter():
                got, want = fused(input_ids=ids).logits, peft_model(input_ids=ids).logits
        else:
            got, want = fused(input_ids=ids).logits, peft_model(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_load_policy_uses_the_fused_layers():
    policy = load_policy("tiny-random-llama", seed=0)
    layers = [m for m in policy.modules() if isinstance(m, PeftLoraLinear)]
    assert layers and all(type(m) is FusedLoraLinear for m in layers)
