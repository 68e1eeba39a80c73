"""torchrun worker for tests/train/test_fsdp.py (2 CPU processes, gloo).

Also imported by the test for the single-process reference, so both sides build the same
LoRA policy and batch.
"""

from __future__ import annotations

import os
import sys

import torch

from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.policy import apply_lora, load_base_model


def build_policy(path: str) -> torch.nn.Module:
    """Tiny model + LoRA with B drawn at random, so both A and B get gradients."""
    model = apply_lora(load_base_model(path, dtype="fp32"), seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 49152, (4, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    return ids, mask


def lora_grads(model: torch.nn.Module, gather) -> dict[str, torch.Tensor]:
    return {n: gather(p).clone() for n, p in model.named_parameters() if p.requires_grad}


def main(model_path: str, out_path: str) -> None:
    from entrogym.train.devices.fsdp import full_grad, init_distributed, shard_policy

    rank, world = init_distributed("cpu")
    ids, mask = batch()

    # (a) what the model's own outputs look like under each mixed-precision policy
    dtypes = {}
    for label, output_dtype in (("default", None), ("fixed", torch.float32)):
        model = shard_policy(
            build_policy(model_path), param_dtype="bf16", output_dtype=output_dtype
        )
        with torch.no_grad():
            dtypes[label] = str(model(input_ids=ids, attention_mask=mask).logits.dtype)

    # (b) exact log-probs and LoRA gradients, each rank scoring its share of the batch
    model = shard_policy(build_policy(model_path), param_dtype="fp32")
    rows = slice(rank * len(ids) // world, (rank + 1) * len(ids) // world)
    logp = sequence_logprobs(model, ids[rows], mask[rows])
    logp.sum().backward()  # FSDP2 averages gradients over ranks
    parts = [torch.zeros_like(logp) for _ in range(world)]
    torch.distributed.all_gather(parts, logp.detach())
    grads = lora_grads(model, full_grad)
    if rank == 0:
        result = {"dtypes": dtypes, "logp": torch.cat(parts), "grads": grads, "world": world}
        torch.save(result, out_path + ".tmp")
        os.replace(out_path + ".tmp", out_path)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
