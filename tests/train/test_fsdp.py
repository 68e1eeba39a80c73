"""FSDP2 on CPU: 2 gloo processes under torchrun against a single-process run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from entrogym.localserver import free_port
from entrogym.models import resolve_model
from entrogym.train.learner.logprobs import sequence_logprobs

WORKER = Path(__file__).with_name("fsdp_worker.py")


def _worker_module():
    spec = importlib.util.spec_from_file_location("fsdp_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fsdp_result(tmp_path_factory):
    path = resolve_model("tiny-random-qwen3")  # untied head: embeddings and head both sharded
    out = tmp_path_factory.mktemp("fsdp") / "result.pt"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(WORKER),
        path,
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return path, torch.load(out)


def test_output_dtype_policy(fsdp_result):
    _, result = fsdp_result
    assert result["world"] == 2
    assert result["dtypes"] == {"default": "torch.bfloat16", "fixed": "torch.float32"}


def test_fsdp_logprobs_and_lora_grads_match_single_process(fsdp_result):
    path, result = fsdp_result
    worker = _worker_module()
    model = worker.build_policy(path)
    ids, mask = worker.batch()
    logp = sequence_logprobs(model, ids, mask)
    (logp.sum() / result["world"]).backward()  # FSDP2 averages the ranks' gradients
    grads = worker.lora_grads(model, lambda p: p.grad)

    assert torch.allclose(result["logp"], logp.detach(), atol=1e-5)
    assert result["grads"].keys() == grads.keys() and len(grads) == 2 * 7 * 2
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(result["grads"][name], grad, rtol=1e-4, atol=1e-6), name
