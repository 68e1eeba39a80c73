"""The sampler mismatch metric never returns NaN: non-finite log-probs are counted and left
out, so a metrics row that carries it stays strict JSON."""

from __future__ import annotations

import json
import math

import torch

from entrogym.train.learner.mismatch import sampler_mismatch


def test_non_finite_sampler_logprobs_are_counted_and_left_out():
    trainer = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0]])
    sampler = torch.tensor([[-1.0, float("nan"), -3.5, float("-inf"), -9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    m = sampler_mismatch(trainer, sampler, mask)
    assert m["sampler_nonfinite"] == 2 and m["trainer_nonfinite"] == 0 and m["num_tokens"] == 2
    assert m["mean_abs_diff"] == 0.25 and m["max_abs_diff"] == 0.5 and m["mean_diff"] == 0.25
    assert json.loads(json.dumps(m, allow_nan=False)) == m


def test_all_non_finite_gives_nulls_not_nan():
    trainer = torch.tensor([[-1.0, float("inf")]])
    sampler = torch.tensor([[float("nan"), -1.0]])
    m = sampler_mismatch(trainer, sampler, torch.ones(1, 2))
    assert m["num_tokens"] == 0 and m["sampler_nonfinite"] == 1 and m["trainer_nonfinite"] == 1
    assert m["mean_abs_diff"] is None and m["frac_ratio_outside"] is None
    row = json.dumps({"sampler_mismatch": m["mean_abs_diff"], **m}, allow_nan=False)
    assert not any(isinstance(v, float) and math.isnan(v) for v in json.loads(row).values())
