"""Finite or not at all: a step whose gradients are not finite is skipped and counted, in every
dtype (fp32 has no loss scaler to notice); ``--max-bad-steps-in-row`` of them in a row stop
the run with one line naming the loss term that produced them; no adapter version is published
or checkpointed unless its weights are finite.

The culprit is a plug-in lever whose loss term is finite (0) but whose gradient is NaN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from vowel_env import TINY_SETTINGS

from entrogym.train.folder.checkpoint import save_checkpoint
from entrogym.train.learner.policy import load_policy, save_adapter

REPO = Path(__file__).resolve().parents[2]

NAN_LEVER = """
import torch

from entrogym.algos import Coefficient, Lever, register_lever


class _NanGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum() * 0.0  # a finite value: 0

    @staticmethod
    def backward(ctx, grad):
        return torch.full(ctx.shape, float("nan"))


@register_lever("nan-grad")
class NanGrad(Lever):
    coefficient = Coefficient("beta", init=0.1, min=0.0, max=1.0, signed=False)
    default_controller = "fixed"

    def extra_loss(self, logprobs, entropies, mask, coef, *, advantages=None, target=None):
        return _NanGradient.apply(logprobs * mask)
"""


def _nan_weights(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, t in tensors.items() if not bool(torch.isfinite(t).all())]


def _train_argv(out: Path) -> list[str]:
    s = TINY_SETTINGS
    return [
        "--env", "vowel_env:test/Vowel-v0", "--model", s["model"], "--engine", "hf",
        "--engine-dtype", "fp32", "--dtype", "fp32", "--tasks-per-iter", "2", "--samples", "2",
        "--early-stop-min-per-task", "2", "--early-stop-fraction", "1.0",
        "--max-response-tokens", "4", "--on-turn-budget", "step", "--max-context-tokens", "256",
        "--env-workers", "0", "--iterations", "4", "--checkpoint-every", "1",
        "--algo", "grpo", "--algo.lever", "nan_lever:nan-grad", "--algo.controller", "fixed",
        "--out", str(out),
    ]  # fmt: skip


def test_a_nan_gradient_is_skipped_counted_and_stops_the_run_in_one_line(tmp_path: Path) -> None:
    """fp32: every step's gradient is NaN. Each is skipped (the weights stay finite), counted in
    ``skipped_steps``, and the third in a row (the default) stops the run: exit 1, one line
    naming the lever's loss term. Every adapter and checkpoint written is finite."""
    from safetensors.torch import load_file

    (tmp_path / "nan_lever.py").write_text(textwrap.dedent(NAN_LEVER))
    out = tmp_path / "run"
    code = (
        f"import sys; from entrogym.commands.train import cli; sys.exit(cli({_train_argv(out)!r}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
        env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    line = errors[0]
    assert line.startswith("entrogym train: error: 3 optimizer steps in a row"), line
    assert "lever 'nan_lever:nan-grad'" in line and "extra_loss" in line, line
    assert "gradient" in line, line
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "skipped_steps" in r]
    assert train_rows and all(r["skipped_steps"] == r["optimizer_steps"] + r["skipped_steps"]
                              for r in train_rows)  # fmt: skip
    assert sum(r["skipped_steps"] for r in train_rows) == 2  # the third stopped the run
    written = sorted((out / "adapters").glob("v*/adapter_model.safetensors"))
    written += sorted((out / "checkpoints").glob("iter-*/adapter/adapter_model.safetensors"))
    assert written
    for weights in written:
        assert not _nan_weights(load_file(str(weights))), weights
    history = [json.loads(h) for h in (out / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["event"] == "stopped"


def _poisoned_policy() -> torch.nn.Module:
    policy = load_policy("tiny-random-llama", seed=0)
    lora = next(p for n, p in policy.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        lora[0, 0] = float("nan")
    return policy


def test_an_adapter_with_non_finite_weights_is_neither_published_nor_checkpointed(
    tmp_path: Path,
) -> None:
    policy = _poisoned_policy()
    with pytest.raises(ArithmeticError, match="not finite") as info:
        save_adapter(policy, tmp_path / "adapters" / "v000001")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "adapters" / "v000001").exists()
    with pytest.raises(ArithmeticError, match="not finite"):
        save_checkpoint(tmp_path, 1, model=policy, optimizer=None, state={}, base_model="x")
    assert not list((tmp_path / "checkpoints").glob("iter-*"))
