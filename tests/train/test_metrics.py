"""metrics.jsonl rows, torn-line recovery, truncation on resume, TensorBoard scalars."""

from __future__ import annotations

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from entrogym.train.folder.metrics import MetricsLogger, cumulative_entropy, read_metrics


def _row(it: int, entropy: float) -> dict:
    return {"iteration": it, "algo": "grpo", "entropy": entropy, "reward_mean": it / 10}


def test_cumulative_entropy_is_the_running_sum():
    assert cumulative_entropy([0.5, 0.25, 1.0]) == [0.5, 0.75, 1.75]
    assert cumulative_entropy([]) == []
    with pytest.raises(ValueError, match=r"entropies\[1\]"):
        cumulative_entropy([0.5, math.nan])


def test_rows_are_appended_and_read_back(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for it in range(1, 4):
            log.log(_row(it, 1.0 / it), step=it)
        log.log({"kind": "eval", "iteration": 3, "accuracy": 0.5}, step=3)
        assert log.rows == 4
    rows = read_metrics(tmp_path)
    assert [r["kind"] for r in rows] == ["train"] * 3 + ["eval"]
    assert [r["step"] for r in rows] == [1, 2, 3, 3]
    assert rows[1]["entropy"] == 0.5
    with MetricsLogger(tmp_path, tensorboard=False) as log:  # reopening appends
        assert log.rows == 4
        with pytest.raises(ValueError, match="kind"):
            log.log({"kind": "test"}, step=4)


def test_torn_last_line_is_dropped(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for it in range(1, 4):
            log.log(_row(it, 0.9), step=it)
    path = tmp_path / "metrics.jsonl"
    with open(path, "ab") as fh:  # what a kill -9 in the middle of a write leaves
        fh.write(b'{"iteration": 4, "entr')
    assert len(read_metrics(tmp_path)) == 3  # readers skip it without touching the file
    with pytest.warns(UserWarning, match="torn last line"):
        log = MetricsLogger(tmp_path, tensorboard=False)
    assert log.rows == 3
    log.log(_row(4, 0.8), step=4)
    log.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3, 4]


def test_damaged_middle_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iteration": 1}\nnot json\n{"iteration": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_metrics(tmp_path)


def test_resume_truncates_to_the_checkpoint_offset(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        for it in range(1, 6):
            log.log(_row(it, 1.0), step=it)
    with pytest.raises(ValueError, match="only 5 complete rows"):
        MetricsLogger(tmp_path, resume_rows=7, tensorboard=False)
    with MetricsLogger(tmp_path, resume_rows=3, tensorboard=False) as log:
        assert log.rows == 3
        assert len(read_metrics(tmp_path)) == 3
        for it in (4, 5):  # the resumed run logs the dropped iterations again
            log.log(_row(it, 2.0), step=it)
    rows = read_metrics(tmp_path)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["entropy"] for r in rows] == [1.0, 1.0, 1.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="does not exist"):
        MetricsLogger(tmp_path / "elsewhere", resume_rows=2, tensorboard=False)


def _scalars(tb_dir) -> EventAccumulator:
    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return acc


def test_tensorboard_scalars_match_the_rows_and_resume_purges(tmp_path):
    # Event files are named ...<second>.<host>.<pid>.<counter>, the counter unpadded: start
    # at 9 so that a resume in the same second would be named ...10 and sort first.
    from tensorboard.summary.writer import event_file_writer

    while event_file_writer._global_uid.get() < 8:
        pass
    with MetricsLogger(tmp_path) as log:
        for it in range(1, 6):
            row = _row(it, 1.0 + it) | {"timing": {"rollout_s": 0.5 * it}, "zeta": None}
            log.log(row, step=it)
        log.log({"kind": "eval", "iteration": 5, "accuracy": 0.25, "split": "dev"}, step=5)
    acc = _scalars(tmp_path / "tb")
    tags = set(acc.Tags()["scalars"])
    assert {"entropy", "reward_mean", "timing/rollout_s", "eval/accuracy"} <= tags
    assert not tags & {"iteration", "step", "kind", "algo", "zeta", "eval/split"}
    assert [(e.step, e.value) for e in acc.Scalars("entropy")] == [
        (i, 1.0 + i) for i in range(1, 6)
    ]
    assert [(e.step, e.value) for e in acc.Scalars("eval/accuracy")] == [(5, 0.25)]

    # Resume from a checkpoint taken after row 3: steps 4 and 5 are logged again, with new values.
    with MetricsLogger(tmp_path, resume_rows=3) as log:
        for it in (4, 5):
            log.log(_row(it, 10.0 + it), step=it)
    acc = _scalars(tmp_path / "tb")
    got = [(e.step, e.value) for e in acc.Scalars("entropy")]
    assert got == [(1, 2.0), (2, 3.0), (3, 4.0), (4, 14.0), (5, 15.0)]


def test_progress_bar_is_silent_off_a_terminal(capsys, monkeypatch):
    from entrogym.train.progress import PROGRESS_ENV, progress

    monkeypatch.delenv(PROGRESS_ENV, raising=False)

    bar = progress(range(5), desc="rollouts")
    assert list(bar) == [0, 1, 2, 3, 4]
    assert bar.disable  # pytest's stderr is not a terminal: no bar in logs
    assert capsys.readouterr().err == ""


def _strict(line: str) -> dict:
    def refuse(token: str):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_written_as_null_counted_and_warned(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        with pytest.warns(RuntimeWarning, match="sampler_mismatch is not finite"):
            log.log({"iteration": 0, "sampler_mismatch": math.nan, "loss": 0.5}, step=0)
        with pytest.warns(RuntimeWarning, match="timing/update_s"):
            log.log(
                {"iteration": 1, "sampler_mismatch": -math.inf, "timing": {"update_s": math.inf}},
                step=1,
            )
        log.log({"iteration": 2, "sampler_mismatch": 0.25}, step=2)
        assert log.nonfinite == {"sampler_mismatch": 2, "timing/update_s": 1}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = [_strict(line) for line in lines]  # a strict parser reads every line
    assert rows[0]["sampler_mismatch"] is None and rows[0]["loss"] == 0.5
    assert rows[0]["nonfinite_fields"] == ["sampler_mismatch"]
    assert rows[1]["timing"] == {"update_s": None}
    assert sorted(rows[1]["nonfinite_fields"]) == ["sampler_mismatch", "timing/update_s"]
    assert rows[2]["sampler_mismatch"] == 0.25 and "nonfinite_fields" not in rows[2]
    with pytest.raises(ValueError, match="NaN"):
        _strict('{"x": NaN}')  # the parser above does reject what the old logger wrote
