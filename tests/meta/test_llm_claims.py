"""benchmarks/llm_claims.py and its statistics (llm_claims_stats.py) on a tiny random Llama:
the clip statistics of bf16 rounding (Thm 3) on constructed ratios and after a real update,
and the sampler mismatch per sampler dtype, end to end."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import llm_claims  # noqa: E402
import llm_claims_stats as stats  # noqa: E402

from entrogym.algos.presets import get_algorithm  # noqa: E402
from entrogym.dtypes import bf16_round  # noqa: E402

MODEL = "tiny-random-llama"
GRPO = get_algorithm("grpo")


def test_rounding_flips_a_ratio_just_below_the_upper_clip_over_it():
    # ratio exp(0.1820) = 1.1996 < 1.2 exactly; bf16(-0.8180) = -0.81640625 makes it 1.2016
    old = torch.tensor([[-1.0, -1.0, -2.0]])
    new = torch.tensor([[-0.8180, -1.0, -2.0]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    out = stats.bf16_clip_effect(new, old, adv, mask, GRPO)
    assert out["fp32"]["clipped_high"] == 0 and out["bf16"]["clipped_high"] == 1
    assert out["bf16"]["clip_frac_high"] == pytest.approx(1 / 3)
    assert out["flips"] == {"high_gained": 1, "high_lost": 0, "low_gained": 0, "low_lost": 0}
    # the same token with a negative advantage is never upper-clipped
    neg = stats.bf16_clip_effect(new, old, -adv, mask, GRPO)
    assert neg["bf16"]["clipped_high"] == 0 and neg["fp32"]["clipped_low"] == 0
    # Thm 3's ratio bias: tokens with new == old are rounded alike, so only the first counts
    bias = out["thm3_ratio_bias"]["mean"]
    exact = math.exp(float(bf16_round(new[0, 0]) + 1.0) - 0.1820) - 1
    assert bias == pytest.approx(exact / 3, rel=1e-4)
    # the null: uniform noise of half an ulp moves the first token over 1.2 about half the time
    nets = out["noise_control_net"]
    assert len(nets) == 200 and set(nets) <= {0, 1} and 0.3 < sum(nets) / 200 < 0.7


def test_sign_test_and_verdict_words():
    assert stats.sign_test(0, 0) is None
    assert stats.sign_test(3, 0) == pytest.approx(1 / 8)
    assert stats.sign_test(0, 3) == 1.0
    row = stats.bf16_clip_effect(
        torch.tensor([[-0.8180]]), torch.tensor([[-1.0]]), torch.tensor([1.0]),
        torch.ones(1, 1), GRPO,
    )  # fmt: skip
    pooled = stats.pool([row, row])
    assert pooled["flips"]["toward_thm3"] == 2 and pooled["flips"]["p_value"] == 0.25
    assert pooled["verdict"].startswith("not shown above noise")
    five = stats.pool([row] * 5)
    assert five["verdict"].startswith("shown") and five["noise_control"]["draws"] == 200
    assert 0 < five["noise_control"]["mean_net_toward"] < 5


@pytest.fixture(scope="module")
def tiny_batch():
    from entrogym.agents.engines import make_engine

    agent = llm_claims.make_agent(MODEL)
    with make_engine("hf", MODEL, dtype="fp32", max_model_len=256) as engine:
        batch = llm_claims.sample_batch(engine, agent, tasks=2, k=2, seed=0)
    # a random model earns no reward: give each group one success so GRPO has a signal
    return dataclasses.replace(batch, rewards=torch.tensor([1.0, 0.0] * (len(batch) // 2)))


def test_one_real_update_moves_the_ratios_and_rounding_changes_only_bf16(tiny_batch):
    from entrogym.commands.demo_runs import parse_run
    from entrogym.experiments import demo_config
    from entrogym.train.learner.policy import load_policy

    cfg = demo_config(parse_run("grpo").algo, Path("unused"), 1, 0.05, 1)
    policy = load_policy(MODEL, seed=0)
    rows = llm_claims.update_and_measure(policy, tiny_batch, GRPO, cfg, steps=1)
    before, after = rows
    assert before["step"] == 0 and after["step"] == 1
    # the fp32 policy scored twice in the same micro-batches: bit-identical, nothing clipped
    assert before["mean_abs_log_ratio"] == 0 and before["thm3_ratio_bias"]["mean"] == 0
    assert sum(before["flips"].values()) == 0 and before["fp32"] == before["bf16"]
    assert not any(before["noise_control_net"])  # ratios of 1 are far from both bounds
    assert after["mean_abs_log_ratio"] > 1e-3  # the step changed the policy
    assert after["thm3_ratio_bias"]["mean"] != 0  # rounding moved the observed ratios
    for name in ("fp32", "bf16"):
        for side in ("low", "high"):
            frac = after[name][f"clip_frac_{side}"]
            assert 0 <= frac <= 1
            assert frac == pytest.approx(after[name][f"clipped_{side}"] / after["tokens"])
    assert after["tokens"] == int(tiny_batch.mask.sum())


def test_command_end_to_end_with_a_table(capsys):
    args = llm_claims.parse_args(
        ["--model", MODEL, "--seeds", "1", "--steps", "1", "--tasks", "2", "--k", "2"]
        + ["--mismatch-tasks", "1"]
        + ["--dtypes", "fp32,bf16", "--threads", "1", "--table"]
    )
    report = llm_claims.run(args)
    clip = report["bf16_clipping"]
    assert clip["self_check_mean_abs_log_ratio_before_step"] == 0
    assert set(clip["pooled"]) == {"step_1"} and clip["verdict"]
    rows = report["sampler_mismatch"]["rows"]
    # an fp32 sampler is the learner up to summation order; bf16 is not
    assert rows["fp32"]["mean_abs_dlogp"] < 1e-4 and rows["fp32"]["sampler_nonfinite"] == 0
    assert rows["bf16"]["mean_abs_dlogp"] > 10 * rows["fp32"]["mean_abs_dlogp"]
    assert report["sampler_mismatch"]["verdict"].startswith("shown")
    table = llm_claims.markdown(report)
    assert "| fp32 |" in table and "| bf16 |" in table and "Verdict" in table


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--claims", "speed"], "--claims"),
        (["--dtypes", "fp64"], "--dtypes"),
        (["--k", "1"], "--k must be >= 2"),
        (["--seeds", "0"], "--seeds must be >= 1"),
    ],
)
def test_bad_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        llm_claims.parse_args(argv)
    assert message in capsys.readouterr().err
