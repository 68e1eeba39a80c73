"""Exact fp32 log-probs / entropies without full logits, and the softmax-gradient fix."""

from __future__ import annotations

import math

import pytest
import torch
from lora_policy import randomise_lora_b

from entrogym import onednn
from entrogym.models import resolve_model
from entrogym.train.learner.logprobs import (
    SOFTMAX_FIX_LOGP_THRESHOLD,
    lm_head_weight,
    sequence_logprobs,
    sequence_logprobs_and_entropy,
    token_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)
from entrogym.train.learner.policy import apply_lora, load_base_model

TOL = 1e-5


def _batch(vocab: int = 49152, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (3, 24), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding
    mask[2, 17:] = 0  # right padding
    return ids, mask


def _fp64_reference(model, ids, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain full logits from the model's own forward, log_softmax in fp64."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logp = torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    return logp, (mask[:, 1:] & mask[:, :-1]).bool()


@pytest.fixture(scope="module", params=["tiny-random-llama", "tiny-random-qwen3"])
def lora_tiny(request):
    model = apply_lora(load_base_model(request.param), seed=0)
    randomise_lora_b(model)
    return model


def test_tied_and_untied_variants(lora_tiny):
    base = lora_tiny.get_base_model()
    tied = base.lm_head.weight.data_ptr() == base.model.embed_tokens.weight.data_ptr()
    assert tied == base.config.tie_word_embeddings
    assert tied == (base.config.model_type == "llama")


def test_agrees_with_fp64_reference_with_lora(lora_tiny):
    ids, mask = _batch()
    out = sequence_logprobs(lora_tiny, ids, mask)
    ref, valid = _fp64_reference(lora_tiny, ids, mask)
    assert out.dtype == torch.float32 and out.shape == ids.shape
    assert (out[:, 1:][valid].double() - ref[valid]).abs().max() <= TOL
    assert out[:, 0].eq(0).all() and out[:, 1:][~valid].eq(0).all()
    # LoRA really is in the path: switching the adapter off changes the log-probs.
    with lora_tiny.disable_adapter():
        assert (sequence_logprobs(lora_tiny, ids, mask) - out).abs().max() > 1e-4


def test_left_padding_matches_unpadded(lora_tiny):
    ids, mask = _batch()
    padded = sequence_logprobs(lora_tiny, ids[1:2], mask[1:2])[0, 6:]
    alone = sequence_logprobs(lora_tiny, ids[1:2, 6:], torch.ones_like(ids[1:2, 6:]))[0]
    assert torch.allclose(padded[1:], alone[1:], atol=TOL)


def test_smollm2_agreement_with_lora():
    model = apply_lora(load_base_model("smollm2-135m-instruct"), seed=0)
    # the head's kernel as the learner's (load_policy): the reference's logits come from the
    # model's own lm_head, and two fp32 kernels round SmolLM2's logits ~2e-5 apart
    onednn.use_for_frozen_linears(model)
    randomise_lora_b(model)
    ids, mask = _batch(seed=3)
    out = sequence_logprobs(model, ids[:, :16], mask[:, :16])
    ref, valid = _fp64_reference(model, ids[:, :16], mask[:, :16])
    assert (out[:, 1:][valid].double() - ref[valid]).abs().max() <= TOL


def test_bf16_model_logprobs_are_exact_fp32_of_its_hidden_states():
    """The product runs in fp32 even when the model computes in bf16; bf16 logits would not."""
    gen = torch.Generator().manual_seed(0)
    hidden = (torch.randn(64, 128, generator=gen) * 2).bfloat16()
    weight = (torch.randn(4096, 128, generator=gen) * 0.5).bfloat16()
    targets = torch.randint(0, 4096, (64,), generator=gen)
    exact = torch.log_softmax(hidden.double() @ weight.double().T, -1)
    exact = exact.gather(1, targets[:, None])[:, 0]
    ours = token_logprobs(hidden, weight, targets)
    assert ours.dtype == torch.float32
    assert (ours.double() - exact).abs().max() <= TOL
    naive = torch.log_softmax((hidden @ weight.T).float(), -1).gather(1, targets[:, None])[:, 0]
    assert (naive.double() - exact).abs().max() > 100 * TOL


def test_grads_and_chunking_match_fp64_autograd():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(37, 32, generator=gen, dtype=torch.float64) * 1.5
    weight = torch.randn(500, 32, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 500, (37,), generator=gen)
    upstream = torch.randn(37, generator=gen, dtype=torch.float64)

    h64, w64 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref = torch.log_softmax(h64 @ w64.T, -1).gather(1, targets[:, None])[:, 0]
    ref_h, ref_w = torch.autograd.grad((ref * upstream).sum(), (h64, w64))
    for chunk in (1, 5, 37, None):
        h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
        out = token_logprobs(h, w, targets, impl="chunked", chunk_size=chunk)
        gh, gw = torch.autograd.grad((out * upstream.float()).sum(), (h, w))
        assert (out.double() - ref).abs().max() <= TOL
        assert torch.allclose(gh.double(), ref_h, atol=1e-4, rtol=1e-4)
        assert torch.allclose(gw.double(), ref_w, atol=1e-4, rtol=1e-4)


def test_entropy_values_and_grads_match_fp64():
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 9, 16, generator=gen, dtype=torch.float64)
    weight = torch.randn(300, 16, generator=gen, dtype=torch.float64)
    h64, w64 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp = torch.log_softmax(h64 @ w64.T, -1)
    ref = -(logp.exp() * logp).sum(-1)
    ref_h, ref_w = torch.autograd.grad(ref.sum(), (h64, w64))
    h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
    ent = token_entropy(h, w, chunk_size=4)
    gh, gw = torch.autograd.grad(ent.sum(), (h, w))
    assert ent.shape == (2, 9) and (ent.double() - ref).abs().max() <= TOL
    assert torch.allclose(gh.double(), ref_h, atol=1e-4, rtol=1e-4)
    assert torch.allclose(gw.double(), ref_w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk", [1, 5, None], ids=["chunk1", "chunk5", "whole"])
def test_fused_logprobs_and_entropy_match_fp64_and_the_separate_kernels(chunk):
    """One pass over the vocabulary gives both: values bitwise those of the separate kernels,
    values and gradients (through both outputs at once) those of fp64 autograd."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(23, 16, generator=gen, dtype=torch.float64) * 1.5
    weight = torch.randn(400, 16, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 400, (23,), generator=gen)
    up_logp, up_ent = (torch.randn(23, generator=gen, dtype=torch.float64) for _ in range(2))
    h64, w64 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp_all = torch.log_softmax(h64 @ w64.T, -1)
    ref_logp = logp_all.gather(1, targets[:, None])[:, 0]
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    loss = (ref_logp * up_logp).sum() + (ref_ent * up_ent).sum()
    ref_h, ref_w = torch.autograd.grad(loss, (h64, w64))

    h, w = hidden.float().requires_grad_(), weight.float().requires_grad_()
    logp, ent = token_logprobs_and_entropy(h, w, targets, impl="chunked", chunk_size=chunk)
    loss = (logp * up_logp.float()).sum() + (ent * up_ent.float()).sum()
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert (logp.double() - ref_logp).abs().max() <= TOL
    assert (ent.double() - ref_ent).abs().max() <= TOL
    assert torch.allclose(gh.double(), ref_h, atol=1e-4, rtol=1e-4)
    assert torch.allclose(gw.double(), ref_w, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        hf, wf = hidden.float(), weight.float()
        assert torch.equal(logp, token_logprobs(hf, wf, targets, impl="chunked", chunk_size=chunk))
        assert torch.equal(ent, token_entropy(hf, wf, chunk_size=chunk))


def test_sequence_entropy_matches_full_logits(lora_tiny):
    ids, mask = _batch()
    logp, ent = sequence_logprobs_and_entropy(lora_tiny, ids, mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = torch.log_softmax(
            lora_tiny(input_ids=ids, attention_mask=mask, position_ids=positions).logits.double(),
            -1,
        )
    ref = -(full.exp() * full).sum(-1)[:, :-1]
    valid = (mask[:, 1:] & mask[:, :-1]).bool()
    assert (ent[:, 1:][valid].double() - ref[valid]).abs().max() <= 1e-4
    assert torch.equal(logp, sequence_logprobs(lora_tiny, ids, mask))


def _confident_case():
    """One position whose target has p > 1 - 2^-23, i.e. 1 - p rounds to 0 in fp32."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(64, 8, generator=gen) * 0.3
    weight[:, 0] = 0.0
    weight[7, 0] = 1.0
    hidden = torch.randn(1, 8, generator=gen)
    hidden[0, 0] = 25.0  # z_7 ~ 25 towers over the other logits (|z| < 3): 1 - p ~ 1e-9
    targets = torch.tensor([7])
    return hidden, weight, targets


def _fp64_grads(hidden, weight, targets):
    h64 = hidden.double().requires_grad_()
    w64 = weight.double().requires_grad_()
    logp = torch.log_softmax(h64 @ w64.T, -1)[0, targets[0]]
    return logp.detach(), *torch.autograd.grad(logp, (h64, w64))


def test_softmax_fix_restores_vanishing_gradient():
    hidden, weight, targets = _confident_case()
    ref_logp, ref_h, ref_w = _fp64_grads(hidden, weight, targets)
    assert ref_logp > SOFTMAX_FIX_LOGP_THRESHOLD  # the regime of the paper's appendix
    assert ref_w[7].abs().max() > 0  # d logp / d W_target = (1 - p) h is tiny but non-zero

    grads = {}
    for fix in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = token_logprobs(h, w, targets, impl="chunked", softmax_fix=fix)
        grads[fix] = torch.autograd.grad(out.sum(), (h, w))
    # Fix off: the sampled token's own term (1 - p) is exactly 0 in fp32 ...
    assert grads[False][1][7].abs().max() == 0
    assert not torch.allclose(grads[False][0].double(), ref_h, rtol=1e-2, atol=0)
    # ... fix on: matches the fp64 reference.
    assert torch.allclose(grads[True][1][7].double(), ref_w[7], rtol=1e-4, atol=0)
    assert torch.allclose(grads[True][0].double(), ref_h, rtol=1e-4, atol=1e-12)
    assert torch.allclose(grads[True][1].double(), ref_w, rtol=1e-4, atol=1e-12)


def test_naive_fp32_autograd_has_the_same_vanishing_gradient():
    """The bug is PyTorch's own fp32 log_softmax backward, not something of ours."""
    hidden, weight, targets = _confident_case()
    w = weight.clone().requires_grad_()
    logp = torch.log_softmax(hidden @ w.T, -1)[0, targets[0]]
    (grad_w,) = torch.autograd.grad(logp, w)
    assert grad_w[7].abs().max() == 0


# 1 - p of the sampled token, from well above to far below the paper's 2^-23 ~ 1.2e-7 threshold.
SWEEP = (1e-3, 1e-4, 1e-5, 3e-6, 1e-6, 3e-7, 1.2e-7, 5e-8, 1e-9)
# Logits of LLM size (~20 to 30): an fp32 ulp there is ~2e-6, the scale of the unfixed error.
LOGIT_SHIFT = 20.0


def _logits_with_complement(q: float, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """fp32 logits whose token 0 has 1 - p = q (set in fp64, before the rounding to fp32)."""
    z = torch.randn(vocab, generator=gen, dtype=torch.float64) * 2 + LOGIT_SHIFT
    z[0] = torch.logsumexp(z[1:], 0) + torch.log(torch.tensor((1 - q) / q, dtype=torch.float64))
    return z.float()


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def test_softmax_fix_is_accurate_across_the_near_one_range():
    """d logp_t / d z_t = 1 - p_t to 1e-3 relative for every 1 - p in SWEEP (identity LM head,
    so the hidden states are the logits). Without the fix the backward's exp(z_t - lse) from an
    fp32 lse loses 1 - p well above the 2^-23 threshold (bandit check, docs/bandit.md)."""
    vocab, gen = 1000, torch.Generator().manual_seed(8)
    logits = torch.stack([_logits_with_complement(q, vocab, gen) for q in SWEEP])
    targets = torch.zeros(len(SWEEP), dtype=torch.long)
    z64 = logits.double().requires_grad_()
    torch.log_softmax(z64, -1).gather(1, targets[:, None]).sum().backward()
    ref = z64.grad
    assert torch.allclose(ref[:, 0], torch.tensor(SWEEP, dtype=torch.float64), rtol=1e-3)

    rel = {}
    for fix in (False, True):
        h = logits.clone().requires_grad_()
        out = token_logprobs(h, torch.eye(vocab), targets, impl="chunked", softmax_fix=fix)
        out.sum().backward()
        rel[fix] = ((h.grad[:, 0].double() - ref[:, 0]).abs() / ref[:, 0]).tolist()
        # sum_j d logp_t / d z_j = (1 - p_t) - sum_{j != t} p_j = 0: the other tokens' -p_j
        # must balance the sampled token's term, relative to that term.
        balance = (h.grad.double().sum(-1).abs() / ref[:, 0]).tolist()
        if fix:
            assert max(balance) < 1e-3, dict(zip(SWEEP, balance, strict=True))
    assert max(rel[True]) < 1e-3, dict(zip(SWEEP, rel[True], strict=True))
    # The test can fail: the unfixed path is >10% off from 1 - p = 1e-6 down (1.0 = vanished).
    assert all(r > 0.1 for q, r in zip(SWEEP, rel[False], strict=True) if q <= 1e-6), rel[False]


def test_softmax_fix_hidden_and_weight_grads_across_the_near_one_range():
    """Through a real LM head: the gradients with respect to the hidden states and the weight
    match fp64 autograd of the same fp32 inputs to 1e-3 relative for every 1 - p in SWEEP."""
    vocab, dim, gen = 500, 16, torch.Generator().manual_seed(9)
    errors: dict[bool, list[float]] = {False: [], True: []}
    for q in SWEEP:
        weight = torch.randn(vocab, dim, generator=gen) * 0.3
        weight[:, 0] = 0.0
        weight[7, 0] = 1.0  # only the target reads the spike dimension
        weight[:, 1] = 1.0  # a shared offset: every logit ~ LOGIT_SHIFT, as in an LLM
        hidden = torch.randn(1, dim, generator=gen)
        hidden[0, 1] = LOGIT_SHIFT
        rest = hidden.double()[0, 1:] @ weight.double()[:, 1:].T
        others = torch.logsumexp(rest[torch.arange(vocab) != 7], 0)
        hidden[0, 0] = float(others - rest[7] + math.log((1 - q) / q))  # z_7: 1 - p = q
        targets = torch.tensor([7])
        ref_logp, ref_h, ref_w = _fp64_grads(hidden, weight, targets)
        assert -math.expm1(float(ref_logp)) == pytest.approx(q, rel=1e-2)
        for fix in (False, True):
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            out = token_logprobs(h, w, targets, impl="chunked", softmax_fix=fix)
            gh, gw = torch.autograd.grad(out.sum(), (h, w))
            # grad_w[7] = (1 - p) h is the sampled token's own term, isolated.
            errors[fix].append(max(_rel(gh, ref_h), _rel(gw[7], ref_w[7]), _rel(gw, ref_w)))
    assert max(errors[True]) < 1e-3, dict(zip(SWEEP, errors[True], strict=True))
    unfixed = errors[False]
    assert all(e > 0.1 for q, e in zip(SWEEP, unfixed, strict=True) if q <= 1e-6), unfixed


def test_bf16_rounding_flag():
    gen = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(50, 16, generator=gen), torch.randn(200, 16, generator=gen)
    targets = torch.randint(0, 200, (50,), generator=gen)
    exact = token_logprobs(hidden, weight, targets)
    h = hidden.clone().requires_grad_()
    rounded = token_logprobs(h, weight, targets, bf16_round_logprobs=True)
    assert torch.equal(rounded, exact.bfloat16().float())
    assert (rounded - exact).abs().max() > 0
    (grad,) = torch.autograd.grad(rounded.sum(), h)  # straight-through: still trainable
    assert grad.abs().sum() > 0


def test_temperature_scales_logits():
    gen = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(10, 8, generator=gen), torch.randn(40, 8, generator=gen)
    targets = torch.randint(0, 40, (10,), generator=gen)
    ref = torch.log_softmax((hidden.double() @ weight.double().T) / 0.7, -1)
    out = token_logprobs(hidden, weight, targets, temperature=0.7)
    assert (out.double() - ref.gather(1, targets[:, None])[:, 0]).abs().max() <= TOL


def test_cce_torch_compile_impl_agrees_on_cpu():
    gen = torch.Generator().manual_seed(7)
    hidden, weight = torch.randn(20, 32, generator=gen), torch.randn(1000, 32, generator=gen)
    targets = torch.randint(0, 1000, (20,), generator=gen)
    ref = torch.log_softmax(hidden.double() @ weight.double().T, -1)
    ref = ref.gather(1, targets[:, None])[:, 0]
    out = token_logprobs(hidden, weight, targets, impl="torch_compile")
    assert (out.double() - ref).abs().max() <= TOL


def test_out_of_vocab_ids_raise(lora_tiny):
    vocab = lm_head_weight(lora_tiny).shape[0]
    ids, mask = _batch()
    for bad in (vocab, -1):
        ids_bad = ids.clone()
        ids_bad[0, 5] = bad
        with pytest.raises(ValueError, match="token ids must lie in"):
            sequence_logprobs(lora_tiny, ids_bad, mask)
    with pytest.raises(ValueError, match="token ids must lie in"):
        token_logprobs(torch.randn(2, 8), torch.randn(10, 8), torch.tensor([3, 10]))


def test_bad_options_raise():
    h, w, t = torch.randn(2, 8), torch.randn(10, 8), torch.tensor([1, 2])
    with pytest.raises(ValueError, match="impl must be one of"):
        token_logprobs(h, w, t, impl="fast")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        token_logprobs(h, w, t, impl="cce")
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(h, w, t, chunk_size=0)


def _kernel_like_cce(hidden, weight, targets, reduction, filter_eps):
    """CPU stand-in for CCE's fused forward: lse - z_t from fp32 logits, as the kernel returns
    it (confident rows come out as 0, the rounding the softmax fix repairs)."""
    assert reduction == "none" and filter_eps is None
    z = hidden @ weight.T
    return torch.logsumexp(z, -1) - z.gather(1, targets[:, None]).squeeze(1)


def test_cce_forward_path_has_the_exact_fp32_backward(monkeypatch):
    # CCE's backward takes only 16-bit inputs, so the cce impl pairs its fp32 forward with the
    # chunked backward. The real kernel runs in the gpu test; here its forward is a CPU double.
    import cut_cross_entropy

    from entrogym.train.learner import lm_head_kernels

    monkeypatch.setattr(cut_cross_entropy, "linear_cross_entropy", _kernel_like_cce)
    gen = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(10, 8, generator=gen), torch.randn(64, 8, generator=gen)
    targets = torch.randint(0, 64, (10,), generator=gen)
    conf_h, conf_w, conf_t = _confident_case()
    for h, w, t in ((hidden, weight, targets), (conf_h, conf_w, conf_t)):
        h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
        logp = lm_head_kernels._CceForwardLogprob.apply(h, w, t, 4, True)
        grad_h, grad_w = torch.autograd.grad(logp.sum(), (h, w))
        h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        ref = torch.log_softmax(h64 @ w64.T, -1).gather(1, t[:, None]).squeeze(1)
        ref_h, ref_w = torch.autograd.grad(ref.sum(), (h64, w64))
        assert (logp.detach().double() - ref.detach()).abs().max() <= TOL
        assert torch.allclose(grad_h.double(), ref_h, rtol=1e-4, atol=1e-6)
        assert torch.allclose(grad_w.double(), ref_w, rtol=1e-4, atol=1e-6)
    # the confident row: the double returned logp = 0, the exact rescoring keeps 1 - p > 0
    assert logp.item() < 0 and grad_w[7].abs().max() > 0


def test_resolve_model_path_is_used_by_policy_loader():
    # sequence_logprobs needs only a transformers model: a plain (non-peft) one works too
    model = load_base_model(resolve_model("tiny-random-llama"))
    ids, mask = _batch()
    out = sequence_logprobs(model, ids, mask)
    ref, valid = _fp64_reference(model, ids, mask)
    assert (out[:, 1:][valid].double() - ref[valid]).abs().max() <= TOL


@pytest.mark.gpu
def test_cce_kernel_on_cuda_agrees_and_keeps_the_softmax_fix():
    model = apply_lora(load_base_model("tiny-random-qwen3", device="cuda"), seed=0)
    randomise_lora_b(model)
    ids, mask = (x.cuda() for x in _batch())
    out = sequence_logprobs(model, ids, mask, impl="cce")
    ref, valid = _fp64_reference(model, ids, mask)
    assert (out[:, 1:][valid].double() - ref[valid]).abs().max() <= TOL

    hidden, weight, targets = (x.cuda() for x in _confident_case())
    _, ref_h, ref_w = _fp64_grads(hidden, weight, targets)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp = token_logprobs(h, w, targets, impl="cce")
    grad_h, grad_w = torch.autograd.grad(logp.sum(), (h, w))
    assert torch.allclose(grad_w[7].double(), ref_w[7], rtol=1e-4, atol=0)
    assert torch.allclose(grad_h.double(), ref_h, rtol=1e-4, atol=1e-12)


def test_frozen_heads_transpose_is_made_once_and_again_when_the_head_changes():
    """The backward's head transpose is kept for a frozen head and made anew after the head is
    written to; the gradient stays the float64 one either way."""
    from entrogym.train.learner import lm_head_kernels

    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(300, 16, generator=gen)  # frozen: requires_grad False
    hidden = torch.randn(11, 16, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 300, (11,), generator=gen)

    def grad_and_copy() -> tuple[torch.Tensor, object]:
        h = hidden.float().requires_grad_()
        token_logprobs(h, weight, targets).sum().backward()
        cached = lm_head_kernels._transposed_head
        return h.grad, None if cached is None else cached[2]

    def reference() -> torch.Tensor:
        h = hidden.clone().requires_grad_()
        torch.log_softmax(h @ weight.double().T, -1).gather(1, targets[:, None]).sum().backward()
        return h.grad

    first, copy1 = grad_and_copy()
    second, copy2 = grad_and_copy()
    if onednn.supported(torch.device("cpu"), torch.float32):  # the transposing path
        assert copy1 is not None and copy2 is copy1
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first.double(), reference(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        weight.mul_(-0.5)  # a new head: its version moves, the old transpose is stale
    third, copy3 = grad_and_copy()
    if onednn.supported(torch.device("cpu"), torch.float32):
        assert copy3 is not copy1 and torch.equal(copy3, weight.t())
    torch.testing.assert_close(third.double(), reference(), rtol=1e-5, atol=1e-5)
