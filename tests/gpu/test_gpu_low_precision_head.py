"""A bf16 / fp16 body with an fp32 LM head on CUDA: fp32 log-probs close to the fp32 model's,
through the trainer's fast scoring path (action-only head, trimmed micro-batch), and finite
LoRA gradients. Skips without CUDA (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import LoraSettings, load_policy

pytestmark = pytest.mark.gpu
MODEL = "tiny-random-qwen3"


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (3, 20), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0  # right padding
    actions = torch.zeros_like(ids, dtype=torch.bool)
    actions[:, 8:14] = True
    return ids.cuda(), mask.cuda(), (actions & mask.bool()).cuda()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16_bit_body_keeps_an_fp32_head_on_cuda(dtype):
    lora = LoraSettings(r=4, alpha=8)
    ref = load_policy(MODEL, dtype="fp32", device="cuda", lora=lora, seed=0)
    low = load_policy(MODEL, dtype=dtype, device="cuda", lora=lora, seed=0, head_dtype="fp32")
    assert low.get_output_embeddings().weight.dtype == torch.float32
    body = {p.dtype for n, p in low.named_parameters() if "lora" not in n and "lm_head" not in n}
    assert {torch.bfloat16 if dtype == "bf16" else torch.float16} <= body
    ids, mask, actions = _rows()
    with torch.no_grad():
        want = sequence_logprobs(ref, ids, mask, score_mask=actions, layout="trimmed")
    got = sequence_logprobs(low, ids, mask, score_mask=actions, layout="trimmed")
    assert got.dtype == torch.float32 and got.device.type == "cuda"
    assert (got.detach() - want)[actions].abs().max() < 0.1
    assert (got[~actions] == 0).all()  # the head ran only at action positions
    got[actions].sum().backward()
    grads = [p.grad for p in low.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
