"""The multi-machine layout on one CPU box: a 2-process gloo learner under ``torchrun`` (FSDP2,
``python -m entrogym train``) with rollouts from a real local ``vllm serve``, against the same
run in one process. Adapters reach the server through vLLM's dynamic LoRA loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from entrogym.agents.engines import make_engine
from entrogym.localserver import free_port
from entrogym.models import resolve_model
from entrogym.train.folder.checkpoint import latest_checkpoint, read_training_state

TESTS = Path(__file__).resolve().parents[1]  # vowel_env.py lives there
MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def server():
    engine = make_engine(
        "vllm-server",
        resolve_model(MODEL),
        dtype="fp32",
        max_model_len=512,
        kv_cache_gb=1,
        max_loras=2,  # what --max-staleness 1 samples with
    )
    yield engine.urls[0]
    engine.close()


def run_learner(procs: int, out: Path, engine: list[str], iterations: int = 2) -> list[dict]:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--nproc_per_node",
        str(procs),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "entrogym",
        "train",
        "--env",
        "vowel_env:test/Vowel-v0",
        "--algo",
        "repo-r",
        "--algo.lever.centering",
        "exact",  # exact entropies too: both gathered paths run
        "--model",
        resolve_model(MODEL),
        *engine,
        "--iterations",
        str(iterations),
        "--tasks-per-iter",
        "2",
        "--samples",
        "3",
        "--early-stop-min-per-task",
        "3",
        "--early-stop-fraction",
        "1.0",
        "--max-response-tokens",
        "6",
        "--on-turn-budget",
        "step",
        "--max-context-tokens",
        "256",
        "--micro-batch-size",
        "3",  # 3 rows over 2 ranks: rank 1 pads with a repeated row
        "--lr",
        "1e-2",
        "--max-grad-norm",
        "1.0",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").open()]


@pytest.fixture(scope="module")
def served_run(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "served"
    engine = ["--engine", "vllm-server", "--engine-urls", server, "--max-staleness", "1"]
    return out, run_learner(2, out, engine, iterations=3)


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    """The hf engine samples the same episodes in every run with the same seed (vLLM's batched
    CPU kernels need not), so 1 and 2 ranks see the same batch and must make the same update."""
    root = tmp_path_factory.mktemp("dist")
    hf = ["--engine", "hf", "--engine-dtype", "fp32"]
    return {n: (root / f"p{n}", run_learner(n, root / f"p{n}", hf)) for n in (1, 2)}


@pytest.mark.slow
def test_two_rank_learner_trains_beside_rollouts_from_vllm_server(served_run):
    """The async loop (--max-staleness 1) with a vllm-server URL and a 2-rank torchrun learner:
    rank 0's rollout thread samples iteration i + 1 from the server while every rank updates
    iteration i; the stale batches are rescored under their version on both ranks."""
    out, rows = served_run
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert all(r["learner_ranks"] == 2 for r in rows)
    assert all(r["episodes"] == 6 and r["optimizer_steps"] >= 1 for r in rows)
    assert [r["policy_version"] for r in rows] == [0, 0, 1]
    assert [r["staleness_max"] for r in rows] == [0, 1, 1]
    # iteration 2 sampled from the adapter iteration 0 wrote (loaded by the server at run time)
    assert (out / "adapters" / "v000001" / "adapter_model.safetensors").is_file()
    ckpt = latest_checkpoint(out)
    assert ckpt is not None and ckpt.name.endswith("2")
    state = read_training_state(ckpt)
    assert state["optimizer"]["state"], "optimizer state was not gathered"
    # the version the next batch samples with, gathered from both ranks' shards
    (kept,) = state["sampler_weights"].values()
    assert kept and all(t.dim() == 2 for t in kept.values())


@pytest.mark.slow
def test_two_ranks_compute_the_one_process_update(hf_runs):
    """Same rollouts in iteration 0, so the update must be the same: the gathered log-probs,
    entropy, loss and the adapter it produced."""
    (out1, rows1), (out2, rows2) = hf_runs[1], hf_runs[2]
    assert rows1[0]["learner_ranks"] == 1
    assert rows1[0]["reward_mean"] == rows2[0]["reward_mean"]
    # grad_norm (before clipping) catches a mis-scaled gradient, which Adam would hide
    for key in ("entropy", "loss", "approx_kl", "ratio_max", "zeta", "grad_norm"):
        assert rows2[0][key] == pytest.approx(rows1[0][key], rel=1e-4, abs=1e-7), key
    a1 = load_file(str(out1 / "adapters" / "v000001" / "adapter_model.safetensors"))
    a2 = load_file(str(out2 / "adapters" / "v000001" / "adapter_model.safetensors"))
    assert a1.keys() == a2.keys() and a1
    # peft starts every lora_B at zero, so |lora_B| after the update is how far it moved (the
    # v000000 folder itself is pruned once v000002 exists)
    moved = max(a1[k].abs().max().item() for k in a1 if "lora_B" in k)
    assert moved > 1e-4, "the update did not move the adapter; the comparison would be vacuous"
    # Adam divides by sqrt(v): float-order noise in a near-zero gradient can move a single
    # weight by a few 1e-5 at lr 1e-2, while a wrong gradient (a missing rank, a double
    # count) moves most weights by ~lr. So: every weight within lr/100, nearly all within 1e-6.
    diffs = torch.cat([(a2[k] - a1[k]).abs().flatten() for k in a1])
    assert diffs.max().item() < 1e-4
    assert (diffs > 1e-6).float().mean().item() < 1e-3
