"""The training loop end to end on a tiny random model with the hf engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vowel_env import TINY_SETTINGS  # importing it registers test/Vowel-v0, test/Const-v0

from entrogym.algos import get_algorithm
from entrogym.algos.algorithm import target_params
from entrogym.algos.presets import ALGORITHMS
from entrogym.commands.train import parse_config
from entrogym.train.config import TrainConfig
from entrogym.train.folder.checkpoint import latest_checkpoint
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.phases import PHASES
from entrogym.train.trainer import train

SMALL = TINY_SETTINGS | dict(
    iterations=2,
    samples=3,
    early_stop_min_per_task=3,
    micro_batch_size=4,  # 6 trajectories: two micro-batches, so accumulation runs
    lr=1e-2,
    max_grad_norm=1.0,
)


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_preset_runs_two_iterations(algo, tmp_path):
    out = train(
        TrainConfig(env="test/Vowel-v0", algo=get_algorithm(algo), out=str(tmp_path), **SMALL)
    )
    rows = [r for r in read_metrics(out) if r["kind"] == "train"]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert any(r["zero_adv_groups"] < r["groups"] for r in rows)  # graded rewards: real signal
    for key in (
        "entropy",
        "cumulative_entropy",
        "reward_mean",
        "success_rate",
        "response_tokens_mean",
        "clip_frac_low",
        "clip_frac_high",
        "ratio_max",
        "approx_kl",
        "zeta",
        "eps_high",
        "zero_adv_groups",
        "sampler_mismatch",
        "rollout_s",
        "update_s",
        "tokens_per_s",
        "generated_tokens",
        "learner_tokens",
        "iteration_s",
    ):
        assert key in rows[0], key
    for row in rows:  # every row says where its time went (entrogym.train.phases)
        phases = row["phases_s"]
        assert set(phases) == set(PHASES)
        assert phases["generation"] > 0 and phases["forward"] > 0 and phases["backward"] > 0
        assert phases["optimizer"] > 0 and phases["publish"] > 0
        assert sum(phases.values()) <= row["iteration_s"]
    assert rows[1]["cumulative_entropy"] == pytest.approx(rows[0]["entropy"] + rows[1]["entropy"])
    assert rows[0]["sampler_mismatch"] < 1e-3  # hf engine and trainer score the same fp32 model
    preset = ALGORITHMS[algo]
    assert rows[0]["optimizer_steps"] == preset.epochs  # 6 trajectories < any minibatch size
    if preset.lever.name in ("repo-r", "repo-d"):
        # Iteration 0 sets the target; iteration 1 uses the start value.
        assert rows[0]["zeta"] == rows[1]["zeta"] == 1e-3
    if preset.lever.name == "entropy-bonus" and preset.controller.name == "paper":
        assert rows[1]["beta"] == 1e-3
    if preset.lever.name == "clip-high":
        assert rows[0]["eps_high"] == rows[1]["eps_high"] == 0.28
    params = target_params(preset)
    if params is None or (params.target_unit, params.step) == ("ratio", "iteration"):
        # the paper's target: the first iteration's entropy
        target = rows[0]["entropy_target"]
        assert target == rows[0]["entropy_tracked"] and rows[0]["entropy_error"] == 0
    else:  # TRL's: absolute, in nats
        assert rows[0]["entropy_target"] == params.target == 0.2
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter-000001"
    # Adapter folders are pruned: the current version and the one before, not one per update.
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v000001", "v000002"]
    assert (tmp_path / "entrogym-run.json").is_file() and (tmp_path / "config.yaml").is_file()


def _run_cli(args: list[str]) -> subprocess.Popen:
    code = (
        "import sys; sys.path.insert(0, 'tests'); import vowel_env; "
        "from entrogym.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _cli_args(out: Path, iterations: int) -> list[str]:
    args = ["train", "--env", "test/Vowel-v0", "--algo", "repo-r", "--out", str(out)]
    for key, value in {**SMALL, "iterations": iterations, "checkpoint_every": 1}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def _kill_at_checkpoint(p: subprocess.Popen, run: Path, name: str = "iter-000001") -> None:
    """SIGKILL the run ``p`` as soon as its checkpoint ``name`` exists."""
    deadline = time.time() + 600
    while time.time() < deadline:
        ckpt = latest_checkpoint(run)
        if ckpt is not None and ckpt.name == name:
            break
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()


def test_resume_after_kill_equals_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    p = _run_cli(_cli_args(full, 3))
    assert p.wait(timeout=600) == 0, p.stdout.read()
    _kill_at_checkpoint(_run_cli(_cli_args(killed, 3)), killed)
    p = _run_cli([*_cli_args(killed, 3), "--resume", "true"])
    output = p.communicate(timeout=600)[0]
    assert p.returncode == 0, output
    assert "resuming" in output
    a = [r for r in read_metrics(full)]
    b = [r for r in read_metrics(killed)]
    assert [r["iteration"] for r in b] == [0, 1, 2]  # nothing lost, nothing duplicated
    for ra, rb in zip(a, b, strict=True):
        for key in ("entropy", "reward_mean", "loss", "zeta", "approx_kl"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (key, ra, rb)


def test_sequential_training_loads_the_adapter_and_base_model_is_checked(tmp_path):
    first = train(
        TrainConfig(
            env="test/Vowel-v0", algo=get_algorithm("rloo"), out=str(tmp_path / "a"), **SMALL
        )
    )
    cfg = TrainConfig(
        env="test/Vowel-v0",
        algo=get_algorithm("grpo"),
        out=str(tmp_path / "b"),
        init_adapter=str(first),
        **SMALL,
    )
    second = train(cfg)
    rows = read_metrics(second)
    first_rows = read_metrics(first)
    # Starting from the trained adapter, iteration 0's policy is the first run's last one:
    # its entropy differs from a fresh LoRA (whose B matrices are zero = the base model).
    assert rows[0]["entropy"] != pytest.approx(first_rows[0]["entropy"], rel=1e-9)
    with pytest.raises(ValueError, match="tiny-random-qwen3|tiny-random-llama"):
        train(
            TrainConfig(
                env="test/Vowel-v0",
                out=str(tmp_path / "c"),
                init_adapter=str(first),
                **{**SMALL, "model": "tiny-random-qwen3"},
            )
        )


def test_constant_reward_run_completes_and_says_so(tmp_path, capsys):
    # A random tiny model never solves arithmetic: every group has equal rewards.
    out = train(
        TrainConfig(env="test/Const-v0", algo=get_algorithm("grpo"), out=str(tmp_path), **SMALL)
    )
    rows = read_metrics(out)
    assert all(r["zero_adv_groups"] == r["groups"] for r in rows)
    assert "no policy-gradient signal" in capsys.readouterr().err


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; presets: rloo"):
        parse_config(["--algo", "ppo"])
    with pytest.raises(ValueError, match="cannot make env"):
        train(TrainConfig(env="test/Nope-v0", out=str(tmp_path / "x"), **SMALL))
    with pytest.raises(ValueError, match="no-such-option"):
        parse_config(["--no-such-option", "1"])
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "metrics.jsonl").write_text(json.dumps({"iteration": 0}) + "\n")
    with pytest.raises(ValueError, match="not empty and not an entrogym run"):
        train(TrainConfig(env="test/Vowel-v0", out=str(tmp_path / "used"), **SMALL))


@pytest.mark.slow
def test_smollm2_with_the_vllm_engine(tmp_path):
    """The default model through in-process vLLM: rollouts with the run's adapter, fp32
    rescoring, a REPO-R update, and a held-out eval of the updated adapter."""
    from entrogym.experiments import ENV, ENV_KWARGS, SYSTEM_PROMPT

    cfg = TrainConfig(
        **TINY_SETTINGS
        | dict(model="smollm2-135m-instruct", engine="vllm", max_response_tokens=16),
        env=ENV,
        env_kwargs=ENV_KWARGS,
        algo=get_algorithm("repo-r"),
        iterations=1,
        micro_batch_size=2,
        system_prompt=SYSTEM_PROMPT,
        eval_env=ENV,
        eval_env_kwargs=ENV_KWARGS,
        eval_split="test",
        eval_every=1,
        eval_tasks=4,
        out=str(tmp_path),
    )
    rows = read_metrics(train(cfg))
    train_row = next(r for r in rows if r.get("kind", "train") == "train")
    eval_row = next(r for r in rows if r.get("kind") == "eval")
    assert train_row["episodes"] == 4 and train_row["optimizer_steps"] >= 1
    assert 0 < train_row["entropy"] < 11  # nats over SmolLM2's 49152-token vocabulary
    # fp32 vLLM samples agree with the fp32 trainer (docs/rollouts.md: ~1e-5)
    assert train_row["sampler_mismatch"] < 1e-3
    assert eval_row["iteration"] == 0 and 0 <= eval_row["pass@1"] <= 1
    assert (tmp_path / "adapters" / "v000001" / "adapter_config.json").is_file()
