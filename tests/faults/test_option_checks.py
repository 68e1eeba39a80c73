"""Options that train nothing or fail late are refused when they are parsed (findings 5 and
10): one line naming the option, exit code 2, before any model loads or any folder is written.
A run that failed before its first checkpoint starts again in the same folder with corrected
values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import hostile_envs  # noqa: F401  (registers faults/Hostile-v0)
import pytest
from vowel_env import TINY_SETTINGS

from entrogym.commands import train as train_command
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.folder.safety import HISTORY_FILE

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]
EVAL = ["--eval-env", "entrogym/Arithmetic-v0", "--eval-every", "1"]
BAD = [
    (["--lora-alpha", "0"], "lora_alpha must be > 0, got 0"),
    (["--lora-alpha", "-8"], "lora_alpha must be > 0, got -8"),
    (["--lora-rank", "0"], "lora_rank must be >= 1, got 0"),
    (["--lr", "-1"], "lr must be > 0, got -1.0"),
    (["--lr", "0"], "lr must be > 0, got 0.0"),
    (["--weight-decay", "-0.1"], "weight_decay must be >= 0, got -0.1"),
    (["--max-grad-norm", "0"], "max_grad_norm must be > 0, got 0.0"),
    (["--seed", "-1"], "seed must be an integer in [0, 4294967295], got -1"),
    (["--seed", str(2**32)], f"seed must be an integer in [0, 4294967295], got {2**32}"),
    ([*EVAL, "--eval-samples", "0"], "eval_samples must be >= 1, got 0"),
    ([*EVAL, "--eval-tasks", "0"], "eval_tasks must be >= 1 or unset, got 0"),
    ([*EVAL, "--eval-every", "-1"], "eval_every must be >= 0, got -1"),
    (
        [*EVAL, "--eval-split", "nope"],
        "eval_split 'nope': env 'entrogym/Arithmetic-v0' has no such split (its splits: "
        "train, test)",
    ),
    (
        ["--split", "nope"],
        "split 'nope': env 'entrogym/Arithmetic-v0' has no such split (its splits: train, test)",
    ),
    (["--env-timeout", "0"], "env_timeout must be > 0 seconds, got 0.0"),
    (["--env-workers", "-1"], "env_workers must be >= 0, got -1"),
    (["--env-max-memory-mb", "10"], "env_max_memory_mb must be >= 256, got 10"),
    (["--shutdown-grace", "-1"], "shutdown_grace must be >= 0 seconds, got -1.0"),
    (["--max-staleness", "-1"], "max_staleness must be >= 0 (0 = synchronous), got -1"),
    (
        ["--max-staleness", "2", "--max-loras", "2"],
        "max_staleness 2 samples with the adapters of 3 weight versions, more than max_loras=2 "
        "the engine holds; raise --max-loras or lower --max-staleness",
    ),
    (
        ["--old-logprobs", "sampler", "--engine-dtype", "fp16"],
        "old_logprobs sampler takes the engine's log-probs as the ratio's denominator, measured "
        "exact only from the hf engine in fp32 (engine 'hf', engine_dtype 'fp16'); pass "
        "--engine hf --engine-dtype fp32 or --old-logprobs learner",
    ),
    (
        ["--old-logprobs", "sampler", "--algo.is-correction", "token_truncate"],
        "algo.is_correction 'token_truncate' weighs learner against sampler log-probs, which "
        "old_logprobs sampler makes equal; drop one of them",
    ),
    (
        ["--algo", "grpo", "--algo.loss.eps-low", "-1"],
        "algo.loss.eps_low must be in [0, 1) (the ratio's lower bound 1 - eps_low must stay "
        "positive) or None, got -1.0",
    ),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[" ".join(b[0][-2:]) for b in BAD])
def test_a_bad_value_is_one_line_before_anything_loads(extra, message, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = (
        "import sys; from entrogym.commands.train import cli; "
        f"rc = cli({[*TINY, '--out', str(out), *extra]!r}); "
        "heavy = {'transformers', 'peft', 'vllm'} & set(sys.modules); "
        "assert not heavy, f'{heavy} imported'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"entrogym train: error: {message}\n"
    assert not out.exists()  # no folder, no lock, no marker


def test_a_path_component_too_long_for_the_filesystem(tmp_path: Path, capsys) -> None:
    out = tmp_path / ("x" * 300) / "run"
    assert train_command.cli([*TINY, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "out: the path component 'xxxxxxxx" in err and "is 300 characters" in err
    assert "at most 255" in err
    assert os.listdir(tmp_path) == []


def test_nan_from_a_config_file_fails_every_check(tmp_path: Path, capsys) -> None:
    # YAML's .nan reaches the config: refused as not finite, whatever the option's range
    for key in ("temperature", "lr", "weight_decay", "early_stop_fraction"):
        message = f"{key} must be a finite number, got nan"
        config = tmp_path / f"{key}.yaml"
        config.write_text(f"{key}: .nan\n")
        assert (
            train_command.cli([*TINY, "--config", str(config), "--out", str(tmp_path / "r")]) == 2
        )
        assert capsys.readouterr().err == f"entrogym train: error: {message}\n"


def _args(out: Path, **values: object) -> list[str]:
    args = ["--env", "faults/Hostile-v0", "--algo", "rloo", "--out", str(out), "--iterations", "2"]
    for key, value in {**TINY_SETTINGS, "tasks_per_iter": 4, **values}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


@pytest.mark.parametrize("restart", ["fresh", "resume"])
def test_a_run_that_failed_before_its_first_checkpoint_restarts_with_new_values(
    tmp_path: Path, capsys, restart: str
) -> None:
    out = tmp_path / "run"
    # every episode raises: the run stops in iteration 0, before any checkpoint
    broken = ["--env-kwargs", "{fault: raise, broken: [t0, t1, t2, t3]}"]
    assert train_command.cli([*_args(out, checkpoint_every=5), *broken]) == 1
    assert "more than max_env_error_fraction" in capsys.readouterr().err
    assert (out / "config.yaml").is_file() and not (out / "checkpoints").exists()
    # the corrected experiment (other env kwargs, another seed) in the same folder
    fixed = [*_args(out, checkpoint_every=5, seed=3), "--env-kwargs", "{fault: none}"]
    if restart == "resume":
        fixed.append("--resume")
    assert train_command.cli(fixed) == 0, capsys.readouterr().err
    rows = read_metrics(out)
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["env_errors"] == 0 for r in rows)
    events = [json.loads(line) for line in (out / HISTORY_FILE).read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "stopped", "restart"]
    assert events[2]["changed"]["seed"] == [0, 3]
