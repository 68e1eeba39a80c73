"""The theory checks (``entrogym theory``) and the formula functions they test."""

from __future__ import annotations

import json
import math

import pytest
import torch

from entrogym.commands import theory as theory_command
from entrogym.theory import checks
from entrogym.theory.formulas import (
    bf16_ratio_bias_predicted,
    bf16_ulp,
    expected_pg_logit_gradient,
    ppo_entropy_bounds,
    predicted_entropy_change_tabular,
    softmax_entropy,
)
from entrogym.theory.numerics import (
    bf16_round,
    log_softmax_grad,
    observed_ratio_bf16,
    trainer_logit_grad,
)


def test_cli_json_meets_the_acceptance_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code = theory_command.cli(["--json", "--n_bf16", "1000000"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["passed"] is True
    assert result["cor1_pearson"] >= 0.99 and result["cor1_n"] >= 200
    assert abs(result["cor1_slope"] - 1) < 0.01
    assert result["ppo_bound_violations"] == 0 and result["ppo_bound_n"] >= 1000
    bf = result["bf16_bias"]
    assert bf["measured"] > 1.0  # Thm 3: the bias is upward
    assert abs(bf["measured"] - bf["predicted"]) < 4 * bf["stderr"]
    sg = result["softmax_grad"]
    assert sg["n_above_threshold"] > 100
    assert sg["vanished_share_above_threshold"] > 0.99
    assert sg["vanished_share_below_threshold"] < 0.01
    assert sg["fp32_max_rel_error_sampled"] == 1.0  # some gradient vanished entirely
    assert sg["trainer_unfixed_vanished_share_above_threshold"] > 0.99
    assert sg["fixed_max_rel_error_sampled"] < 1e-5


def test_too_few_samples_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="n_policies"):
        checks.run_checks(n_policies=50)


def test_cor1_formula_matches_finite_difference_and_autograd() -> None:
    logits = torch.tensor([2.0, 0.5, -1.0, 0.0], dtype=torch.float64, requires_grad=True)
    rewards = torch.tensor([1.0, 0.2, 0.0, 0.7], dtype=torch.float64)
    (torch.softmax(logits, -1) * rewards).sum().backward()
    assert torch.allclose(logits.grad, expected_pg_logit_gradient(logits.detach(), rewards))
    lr = 1e-4
    with torch.no_grad():
        measured = softmax_entropy(logits + lr * logits.grad) - softmax_entropy(logits)
        predicted = predicted_entropy_change_tabular(logits, rewards, lr)
    # Calibrated policy (likely arms pay more): entropy goes down, as Sec. 3 says.
    assert predicted < 0
    assert math.isclose(float(measured), float(predicted), rel_tol=1e-3)


def test_ppo_bound_holds_inside_and_fails_outside_the_clip_range() -> None:
    result = checks.check_ppo_bound(n_pairs=90, seed=5)
    assert result["ppo_bound_violations"] == 0
    # A pair whose ratios leave [0.8, 1.2] can break the bound: the check is not vacuous.
    old = torch.tensor([0.0, 0.0], dtype=torch.float64)
    new = torch.tensor([4.0, 0.0], dtype=torch.float64)
    lower, _ = ppo_entropy_bounds(softmax_entropy(old), 0.2, 0.2)
    assert softmax_entropy(new) < lower


def test_bf16_rounding_and_predicted_bias() -> None:
    x = torch.tensor([-10.03125, -0.3], dtype=torch.float32)
    assert bf16_round(x)[0] == -10.0  # ulp at 8..16 is 1/16: -10.03125 rounds to -10.0
    expected_ulp = torch.tensor([2.0**-4, 2.0**-7], dtype=torch.float64)
    assert torch.equal(bf16_ulp(torch.tensor([-10.0, -1.5])), expected_ulp)
    ulp = torch.tensor(2.0**-4, dtype=torch.float64)
    assert float(bf16_ratio_bias_predicted(ulp, ulp)) == pytest.approx(1 + 2 * ulp**2 / 24)
    assert torch.allclose(observed_ratio_bf16(x, x), torch.ones(2))


def test_softmax_gradient_vanishes_in_fp32_and_the_fix_restores_it() -> None:
    logits = torch.tensor([[20.0, 0.0, 0.0, 0.0]])  # 1 - p = 3 e^-20 ~ 6e-9 < 2^-23
    targets = torch.tensor([0])
    assert log_softmax_grad(logits, targets)[0, 0] == 0.0
    assert trainer_logit_grad(logits, targets, softmax_fix=False)[0, 0] == 0.0
    fixed = trainer_logit_grad(logits, targets, softmax_fix=True)
    exact = 3 * math.exp(-20) / (1 + 3 * math.exp(-20))
    assert float(fixed[0, 0]) == pytest.approx(exact, rel=1e-6)
    # The other entries are untouched: -p_j.
    assert torch.allclose(fixed[0, 1:], log_softmax_grad(logits, targets)[0, 1:])
