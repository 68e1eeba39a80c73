"""Per-iteration metrics of a run: ``RUN/metrics.jsonl`` (one JSON object a line) and TensorBoard.

Rows carry ``"kind": "train"`` (one per iteration) or ``"kind": "eval"``. Every row is
flushed and fsynced as it is written, so a ``kill -9`` can at most leave a torn last line,
which the next :class:`MetricsLogger` drops. The file is strict JSON: a non-finite float
(NaN, inf) is written as ``null``, counted in the row's ``nonfinite_fields`` and warned about
once per field, never written as the non-standard ``NaN`` token. The number of complete rows (:attr:`rows`) is
stored in each checkpoint; resuming truncates the file back to it, so the iterations after
the checkpoint are logged again exactly once.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from entrogym.train.folder.trackers import TB_DIR, TensorboardTracker, Trackers
from entrogym.train.folder.turn_metrics import turns_text

METRICS_FILE = "metrics.jsonl"
# Row fields that index the row rather than measure something; not sent to TensorBoard.
_INDEX_FIELDS = frozenset({"iteration", "step", "kind"})


def cumulative_entropy(entropies: Iterable[float]) -> list[float]:
    """Running sum of the per-iteration mean token entropy.

    The x axis of Figure 1 (bottom) of the paper: "cumulative entropy experienced during
    training up to a given checkpoint". Entry ``k`` is ``sum(entropies[: k + 1])``.
    """
    total, out = 0.0, []
    for i, h in enumerate(entropies):
        if h is None or not math.isfinite(float(h)):
            raise ValueError(f"entropies[{i}] is {h!r}; every iteration needs a finite entropy")
        total += float(h)
        out.append(total)
    return out


def _metrics_path(run_dir: str | os.PathLike[str]) -> Path:
    p = Path(run_dir)
    return p if p.suffix == ".jsonl" else p / METRICS_FILE


def _scan(data: bytes, path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """Parse ``data`` into its complete rows and the byte offset just past each of them.

    Whatever follows the last complete row (a torn write) is not a row.
    """
    rows: list[dict[str, Any]] = []
    ends: list[int] = []
    end = 0
    lines = data.split(b"\n")
    # The last element is what follows the final newline: empty, or a torn write.
    for lineno, line in enumerate(lines[:-1], start=1):
        try:
            row = json.loads(line)
        except ValueError as exc:
            if lineno == len(lines) - 1:  # a damaged last line: the same as a torn one
                break
            raise ValueError(
                f"{path}: line {lineno} is not JSON ({exc}); the file is damaged before its "
                "last line. Remove or fix that line."
            ) from exc
        if not isinstance(row, dict):
            raise ValueError(
                f"{path}: line {lineno} is a {_json_kind(row)}, not a JSON object; remove or "
                "fix that line"
            )
        end += len(line) + 1
        rows.append(row)
        ends.append(end)
    return rows, ends


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The complete rows of ``RUN/metrics.jsonl`` (``run_dir`` may also be the file itself).

    A torn last line (a run killed mid-write) is ignored; the file is not modified.
    """
    path = _metrics_path(run_dir)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: is {run_dir} a run folder?")
    return _scan(path.read_bytes(), path)[0]


def _numeric_items(row: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for key, value in row.items():
        if not prefix and key in _INDEX_FIELDS:
            continue
        if isinstance(value, dict):
            yield from _numeric_items(value, f"{prefix}{key}/")
        elif isinstance(value, int | float):  # bool is an int: logged as 0.0 or 1.0
            yield f"{prefix}{key}", float(value)


def strict_json_row(row: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``row`` with every non-finite float (nested ones too) replaced by None, and the dotted
    names of the fields that were replaced."""
    bad: list[str] = []

    def clean(value: Any, name: str) -> Any:
        if isinstance(value, dict):
            return {k: clean(v, f"{name}{k}/") for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v, f"{name}{i}/") for i, v in enumerate(value)]
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(name.rstrip("/"))
            return None
        return value

    return clean(row, ""), bad


class MetricsLogger:
    """Append rows to ``RUN/metrics.jsonl`` and the same numeric scalars to ``RUN/tb/`` and to
    the run's other trackers (``trackers``: :class:`entrogym.train.folder.trackers.Trackers`).

    ``resume_rows=N`` keeps only the first N complete rows (the metrics offset saved in the
    checkpoint being resumed); TensorBoard events from the dropped steps on are purged.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        resume_rows: int | None = None,
        tensorboard: bool = True,
        trackers: Any = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if resume_rows is not None and resume_rows < 0:
            raise ValueError(f"resume_rows must be >= 0, got {resume_rows}")
        kept = self._open_existing(resume_rows)
        self.rows = len(kept)
        self.nonfinite: dict[str, int] = {}  # field -> rows where it was NaN/inf (written null)
        self._fh = open(self.path, "ab")  # noqa: SIM115 (held open for the run)
        self._trackers = trackers  # entrogym.train.folder.trackers.Trackers: the other --report-to
        if tensorboard:
            # Steps logged after the checkpoint are logged again; hide their old events.
            purge = None
            if resume_rows is not None:
                purge = max((int(r.get("step", -1)) for r in kept), default=-1) + 1
                _wait_for_a_later_second(self.run_dir / TB_DIR)
            if self._trackers is None:
                self._trackers = Trackers([], self.run_dir, {}, resume=resume_rows is not None)
            self._trackers.add(TensorboardTracker(purge))

    def _open_existing(self, resume_rows: int | None) -> list[dict[str, Any]]:
        if not self.path.exists():
            if resume_rows:
                raise ValueError(
                    f"resume_rows={resume_rows} but {self.path} does not exist; the run folder "
                    "does not match the checkpoint being resumed"
                )
            return []
        data = self.path.read_bytes()
        rows, ends = _scan(data, self.path)
        end = ends[-1] if ends else 0
        if end != len(data):
            warnings.warn(
                f"{self.path}: dropping a torn last line ({len(data) - end} bytes) left by an "
                "interrupted run",
                stacklevel=3,
            )
        if resume_rows is not None:
            if resume_rows > len(rows):
                raise ValueError(
                    f"resume_rows={resume_rows} but {self.path} holds only {len(rows)} complete "
                    "rows; metrics were lost after the checkpoint was written. Resume from a "
                    "copy of the run folder with its metrics.jsonl intact, or start a new run."
                )
            end = ends[resume_rows - 1] if resume_rows else 0
            rows = rows[:resume_rows]
        if end != len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
        return rows

    def log(self, row: dict[str, Any], step: int) -> None:
        """Write one row (``kind`` defaults to ``"train"``); eval rows go to ``eval/`` in
        TensorBoard. The row is on disk when this returns."""
        row = {**row, "step": int(step)}
        row.setdefault("kind", "train")
        if row["kind"] not in ("train", "eval"):
            raise ValueError(f"row kind must be 'train' or 'eval', got {row['kind']!r}")
        row = self._strict(row)
        line = json.dumps(row, allow_nan=False) + "\n"
        self._fh.write(line.encode())  # one write: a kill leaves the whole line or a torn tail
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.rows += 1
        prefix = "eval/" if row["kind"] == "eval" else ""
        scalars = {prefix + tag: value for tag, value in _numeric_items(row)}
        if self._trackers is not None:
            self._trackers.log(scalars, int(step))

    def _strict(self, row: dict[str, Any]) -> dict[str, Any]:
        """Non-finite values become null (strict JSON), counted in the row and warned about
        once per field; a reader can tell a missing value from a NaN one."""
        row, bad = strict_json_row(row)
        if bad:
            row["nonfinite_fields"] = bad
        for name in bad:
            if name not in self.nonfinite:
                warnings.warn(
                    f"{self.path}: {name} is not finite (step {row['step']}); written as null "
                    "(counted in the row's nonfinite_fields)",
                    RuntimeWarning,
                    stacklevel=3,
                )
            self.nonfinite[name] = self.nonfinite.get(name, 0) + 1
        return row

    def close(self, quiet: bool = False) -> None:
        """Close the file and the trackers (``quiet``: the run is stopping on an error of its
        own; trackers that cannot close then are not reported)."""
        if not self._fh.closed:
            self._fh.close()
        if self._trackers is not None:
            self._trackers.close(quiet=quiet)
            self._trackers = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summary_line(row: dict[str, Any]) -> str:
    """One iteration's row as the line the trainer prints."""
    zeta = "" if row.get("zeta") is None else f" zeta={row['zeta']:.2g}"
    eps = "" if row.get("eps_high") is None else f" eps_high={row['eps_high']:.3g}"
    dependence = row.get("input_dependence")
    mi = "" if dependence is None else f" input_dependence={dependence:.4f}"
    return (
        f"[{row['algo']}] iter {row['iteration']}: reward={row['reward_mean']:.3f} "
        f"entropy={row['entropy']:.4f}{mi} clip_low={row.get('clip_frac_low', 0):.3f} "
        f"clip_high={row.get('clip_frac_high', 0):.3f}{zeta}{eps} "
        f"rollout={row['rollout_s']:.1f}s update={row['update_s']:.1f}s{turns_text(row)}"
    )


def _wait_for_a_later_second(tb_dir: Path) -> None:
    """Sleep (under a second) until the clock is past every event file's second in ``tb_dir``.

    TensorBoard reads event files in name order and applies a resume's ``purge_step`` only to
    events read before it. Names are ``events.out.tfevents.<second>.<host>.<pid>.<n>`` with an
    unpadded counter ``n``, so two files from one process in one second can sort the wrong way
    (``...9`` after ``...10``) and the old steps would survive the purge.
    """
    seconds = [int(f.name.split(".")[3]) for f in tb_dir.glob("events.out.tfevents.*")
               if f.name.split(".")[3].isdigit()]  # fmt: skip
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(max(seconds) + 1 - time.time())
