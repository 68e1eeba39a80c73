"""``--engine-decode {generate,static,static-cdf}``: the option reaches the ``hf`` engine of
``train`` and ``eval``, a wrong combination is one line before any model loads, and a tiny training run
samples the same tokens on both decode paths (fp32, one seed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from entrogym.agents import engines
from entrogym.agents.engines.hf import HFEngine
from entrogym.commands import eval as eval_command
from entrogym.commands import train as train_command
from entrogym.train.config import TrainConfig
from entrogym.train.learner import policy as policy_module

TINY = ["--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32"]
ARITHMETIC = ["--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 8, num_test: 4}"]


def test_the_option_parses_and_goes_to_the_hf_engine_only() -> None:
    for path in ("static", "static-cdf"):
        cfg = train_command.parse_config([*TINY, "--engine-decode", path])
        assert cfg.engine_decode == path
        assert cfg.engine_kwargs()["decode"] == path
    assert train_command.parse_config(TINY).engine_kwargs()["decode"] == "generate"
    served = TrainConfig(engine="vllm-server", engine_urls=["http://a:1"])
    assert "decode" not in served.engine_kwargs()  # the vLLM engines take no such keyword
    with pytest.raises(ValueError, match="engine_decode.*fast"):
        train_command.parse_config([*TINY, "--engine-decode", "fast"])
    with pytest.raises(ValueError, match="engine_decode must be one of"):
        TrainConfig(engine="hf", engine_decode="fast")  # a YAML value or a caller's


@pytest.mark.parametrize(
    ("cli", "argv"),
    [
        (train_command.cli, ["--engine", "vllm", "--engine-decode", "static"]),
        (train_command.cli, ["--engine", "vllm-server", "--engine-urls", "http://a:1",
                             "--engine-decode", "static"]),
        (eval_command.cli, ["--env", "entrogym/Arithmetic-v0", "--engine", "vllm",
                            "--engine-decode", "static"]),
    ],
)  # fmt: skip
def test_static_with_another_engine_exits_2_before_any_model_loads(
    cli: Any, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model loaded before the bad option was refused")

    monkeypatch.setattr(engines, "make_engine", no_model)
    monkeypatch.setattr(policy_module, "load_policy", no_model)
    assert cli([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "applies to the hf engine only" in err
    assert "--engine-decode" in err and not (tmp_path / "out").exists()


def test_eval_hands_the_decode_path_to_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    make = engines.make_engine

    def recording(kind: str, model: str, **kwargs: Any) -> Any:
        seen.append({"kind": kind, **kwargs})
        return make(kind, model, **kwargs)

    monkeypatch.setattr(engines, "make_engine", recording)
    argv = ["--env", "entrogym/Arithmetic-v0", *TINY, "--max-tasks", "1"]
    argv += ["--max-response-tokens", "4", "--engine-decode", "static"]
    assert eval_command.cli([*argv, "--out", str(tmp_path / "ev")]) == 0
    assert [(s["kind"], s["decode"]) for s in seen] == [("hf", "static")]


def _train(out: Path, decode: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two iterations of a tiny run on decode path ``decode``; returns the decode path each hf
    engine it started samples with."""
    started: list[str] = []
    init = HFEngine.__init__

    def recording(self: HFEngine, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        started.append(self.decode)  # after start: a fallback to generate would show here

    monkeypatch.setattr(HFEngine, "__init__", recording)
    argv = [*TINY, *ARITHMETIC, "--iterations", "2", "--tasks-per-iter", "2", "--samples", "3"]
    argv += ["--early-stop-min-per-task", "3", "--early-stop-fraction", "1.0"]
    argv += ["--max-response-tokens", "6", "--threads", "1", "--seed", "5", "--lr", "1e-2"]
    argv += ["--algo", "grpo", "--report-to", "none", "--engine-decode", decode]
    assert train_command.cli([*argv, "--out", str(out)]) == 0
    return started


def _sampled(out: Path) -> dict[str, Any]:
    """What the run's samples decide: its metrics rows without timings, and the adapters."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    keys = ("entropy", "reward_mean", "success_rate", "response_tokens_mean",
            "generated_tokens", "learner_tokens", "zero_adv_groups", "loss")  # fmt: skip
    adapters = {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / "adapters").rglob("*.safetensors"))
    }
    return {"rows": [{k: row.get(k) for k in keys} for row in rows], "adapters": adapters}


def test_static_decode_trains_on_the_tokens_generate_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _train(tmp_path / "generate", "generate", monkeypatch) == ["generate"]
    assert _train(tmp_path / "static", "static", monkeypatch) == ["static"]
    want, got = _sampled(tmp_path / "generate"), _sampled(tmp_path / "static")
    assert len(want["rows"]) == 2 and want["adapters"]
    assert all(row["entropy"] is not None for row in want["rows"])
    assert got == want
