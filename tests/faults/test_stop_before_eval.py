"""A stop that lands between an iteration's update and its held-out evaluation: the run
checkpoints that iteration without evaluating it (so the stop is not delayed by an
evaluation), and the resumed run evaluates those weights before it goes on, so its metrics
have every evaluation an uninterrupted run's have, equal to them, in the same order."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import vowel_env  # registers test/VowelTurns-v0; RESUMABLE_RUN

from entrogym.train.config import TrainConfig
from entrogym.train.folder.metrics import read_metrics
from entrogym.train.shutdown import Interrupted
from entrogym.train.trainer import Trainer, train

ITERATIONS = 4
SETTINGS = {
    **vowel_env.RESUMABLE_RUN,
    "env": "test/VowelTurns-v0",
    "eval_env": "test/VowelTurns-v0",
    "eval_split": "test",
    "eval_every": 2,  # due after iterations 0, 2 and 3 (the last)
    "checkpoint_every": 50,
}
KEYS = ("entropy", "reward_mean", "loss", "cumulative_entropy")
EVAL_KEYS = ("iteration", "pass@1", "reward_mean")


def _config(out: Path, resume: bool = False) -> TrainConfig:
    return TrainConfig(out=str(out), iterations=ITERATIONS, resume=resume, **SETTINGS)


def _summary(rows: list[dict]) -> list[tuple]:
    """Each row's kind with the values the comparison is about, in the file's order."""
    out = []
    for row in rows:
        kind = row.get("kind", "train")
        keys = EVAL_KEYS if kind == "eval" else KEYS
        out.append((kind, row.get("iteration"), *(row.get(k) for k in keys)))
    return out


def test_a_stop_before_a_due_evaluation_is_evaluated_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = read_metrics(train(_config(tmp_path / "reference")))
    assert [r["iteration"] for r in reference if r.get("kind") == "eval"] == [0, 2, 3]

    # SIGTERM arrives just after iteration 2's update, before its due evaluation.
    evaluate_and_save = Trainer._evaluate_and_save

    def signal_after_update(self: Trainer, it: int, row: dict) -> None:
        if it == 2:
            self.shutdown.signum = signal.SIGTERM
        evaluate_and_save(self, it, row)

    run = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_evaluate_and_save", signal_after_update)
        with pytest.raises(Interrupted):
            train(_config(run))
    stopped = read_metrics(run)
    assert [r["iteration"] for r in stopped if r.get("kind") == "eval"] == [0]  # 2 not run

    resumed = read_metrics(train(_config(run, resume=True)))
    assert _summary(resumed) == _summary(reference)
