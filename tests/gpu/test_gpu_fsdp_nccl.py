"""FSDP2 on CUDA with the NCCL backend, one process: the sharded LoRA policy's log-probs and
LoRA gradients equal the unsharded model's, and the root's fp32 output policy holds with a
bf16 body. Skips without CUDA (tests/conftest.py).

The worker runs in a subprocess with torchrun's environment (RANK=0, WORLD_SIZE=1), so the
process group never outlives it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_on_nccl_matches_the_unsharded_model(tmp_path):
    from entrogym.models import resolve_model

    out = tmp_path / "result.pt"
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    env["MASTER_PORT"] = str(_free_port())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS / "train"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, __file__, resolve_model("tiny-random-llama"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out)
    assert got["backend"] == "nccl"
    assert got["bf16_logits_dtype"] == "torch.float32"
    # fp32 rounding only: the sharded and unsharded forwards run different cuBLAS kernels, so
    # they agree to a few ulps (seen on an H100: 1.3e-5 on log-probs near -10.9, ~14 ulps),
    # not bit for bit. torch's fp32 tolerances (rtol 1.3e-6, atol 1e-5) allow that; a wrong
    # shard, scale or mask is off by orders of magnitude more.
    torch.testing.assert_close(got["logp"], got["ref_logp"])
    for name, ref in got["ref_grads"].items():
        assert (got["grads"][name] - ref).abs().max() <= 1e-4 * max(ref.abs().max(), 1e-6), name


def _worker(model_path: str, out_path: str) -> None:
    from fsdp_worker import batch, build_policy, lora_grads

    from entrogym.train.devices.fsdp import full_grad, init_distributed, shard_policy
    from entrogym.train.learner.logprobs import sequence_logprobs

    init_distributed("cuda")
    ids, mask = (x.cuda() for x in batch())
    ref = build_policy(model_path).cuda()
    ref_logp = sequence_logprobs(ref, ids, mask)
    ref_logp.sum().backward()
    model = shard_policy(build_policy(model_path).cuda(), param_dtype="fp32")
    logp = sequence_logprobs(model, ids, mask)
    logp.sum().backward()
    low = shard_policy(build_policy(model_path).cuda(), param_dtype="bf16")
    with torch.no_grad():
        bf16_dtype = str(low(input_ids=ids, attention_mask=mask).logits.dtype)
    result = {
        "backend": torch.distributed.get_backend(),
        "bf16_logits_dtype": bf16_dtype,
        "logp": logp.detach().cpu(),
        "ref_logp": ref_logp.detach().cpu(),
        "grads": {k: v.cpu() for k, v in lora_grads(model, full_grad).items()},
        "ref_grads": {k: v.cpu() for k, v in lora_grads(ref, lambda p: p.grad).items()},
    }
    torch.save(result, out_path)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
