"""The ``aepo`` lever in ``entrogym train``: each iteration draws its extra samples at the
controller's temperature T with the current weights and logs T; the extra draws leave the run's
own batches as they are; an async run is refused before any model loads."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from entrogym.agents import engines
from entrogym.agents.engines.hf import HFEngine
from entrogym.algos import UpdateBatch
from entrogym.algos.aepo import TemperatureSamples
from entrogym.commands.train import cli
from entrogym.train.folder.safety import adapter_folder
from entrogym.train.learner import policy as policy_module
from entrogym.train.learner.update import Learner

TASKS, SAMPLES = 4, 2
RUN = [
    "--model", "tiny-random-llama", "--engine", "hf", "--engine-dtype", "fp32",
    "--env", "entrogym/Arithmetic-v0", "--env-kwargs", "{num_train: 8, num_test: 4}",
    "--iterations", "2", "--tasks-per-iter", str(TASKS), "--samples", str(SAMPLES),
    "--early-stop-min-per-task", str(SAMPLES), "--early-stop-fraction", "1.0",
    "--max-response-tokens", "6", "--threads", "1", "--seed", "3", "--lr", "1e-2",
    "--report-to", "none",
]  # fmt: skip
AEPO = ["--algo", "grpo", "--algo.lever", "aepo", "--algo.lever.share", "0.5"]


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _record_generate(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[float], str]]:
    """Every generate call of the hf engine: the temperature of each prompt, and the adapter."""
    calls: list[tuple[list[float], str]] = []
    generate = HFEngine.generate

    def recording(
        self: HFEngine, prompts: Any, params: Any, adapter: Any = None, **kwargs: Any
    ) -> Any:  # kwargs: the rollout's cache_keys, passed on
        listed = params if isinstance(params, list | tuple) else [params] * len(prompts)
        calls.append(([p.temperature for p in listed], str(adapter)))
        return generate(self, prompts, params, adapter, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", recording)
    return calls


def test_aepo_draws_its_samples_at_the_logged_temperature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _record_generate(monkeypatch)
    scored: list[tuple[bool, bool]] = []
    attach = Learner.temperature_samples

    def watched(self: Learner, batch: UpdateBatch) -> TemperatureSamples:
        samples = attach(self, batch)

        def score() -> Any:
            logprobs = samples.score()
            scored.append((logprobs.requires_grad, logprobs.shape == samples.mask.shape))
            return logprobs

        return TemperatureSamples(samples.rewards, samples.mask, score)

    monkeypatch.setattr(Learner, "temperature_samples", watched)
    out = tmp_path / "run"
    # T_high 1.5 and T_low 0.7: neither is the rollouts' temperature 1
    options = [*AEPO, "--algo.controller.max", "1.5", "--algo.controller.min", "0.7"]
    options += ["--algo.controller.init", "1.5"]
    assert cli([*RUN, *options, "--out", str(out)]) == 0
    rows = [r for r in _rows(out) if r.get("kind", "train") == "train"]
    assert len(rows) == 2
    extra = math.ceil(0.5 * TASKS) * SAMPLES
    assert rows[0]["aepo_temperature"] == 1.5  # the switch starts where it was told
    for it, row in enumerate(rows):
        assert row["aepo_temperature"] in (0.7, 1.5) and row["aepo_samples"] == extra
        assert 0 <= row["aepo_reward"] <= 1
        # this iteration's calls: the batch at temperature 1, then the extras at T, both
        # sampled by the current weights (version it)
        mine = [c for c in calls if c[1] == str(adapter_folder(out, it))]
        temps = [t for c in mine for t in c[0]]
        assert temps.count(1.0) == TASKS * SAMPLES
        assert temps.count(row["aepo_temperature"]) == extra
        assert len(temps) == TASKS * SAMPLES + extra
    # the lever rescored them with gradients, once per micro-batch of each update
    assert scored and all(grad and shaped for grad, shaped in scored)


def test_the_extra_draws_leave_the_run_s_batches_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With alpha 0 the lever's term adds nothing, so the run must train on exactly the batches
    a GRPO run samples: the extra draws (seeded apart) move neither the engine's stream nor the
    learner's."""
    batches: list[str] = []
    compute = UpdateBatch.compute_advantages

    def watched(self: UpdateBatch, *args: Any, **kwargs: Any) -> Any:
        ids = (self.input_ids * self.attention_mask).tolist()
        batches.append(hashlib.sha256(json.dumps(ids).encode()).hexdigest())
        return compute(self, *args, **kwargs)

    monkeypatch.setattr(UpdateBatch, "compute_advantages", watched)
    assert cli([*RUN, "--algo", "grpo", "--out", str(tmp_path / "grpo")]) == 0
    grpo, batches[:] = list(batches), []
    options = [*AEPO, "--algo.lever.alpha", "0"]
    assert cli([*RUN, *options, "--out", str(tmp_path / "aepo")]) == 0
    assert len(grpo) == 2 and batches == grpo
    rows = _rows(tmp_path / "aepo")
    assert all(r["aepo_samples"] > 0 for r in rows)
    assert [r["loss"] for r in rows] == [r["loss"] for r in _rows(tmp_path / "grpo")]


def test_aepo_with_async_rollouts_is_refused_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model loaded before the bad combination was refused")

    monkeypatch.setattr(engines, "make_engine", no_model)
    monkeypatch.setattr(policy_module, "load_policy", no_model)
    out = tmp_path / "run"
    assert cli([*RUN, *AEPO, "--max-staleness", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lever aepo" in err and "--max-staleness 0" in err
    assert not out.exists()
