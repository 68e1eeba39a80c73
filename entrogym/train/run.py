"""The run: the folder ``--out`` one training run writes, and what it keeps there.

Its lock (one writer at a time), the checkpoint a ``--resume`` starts from (the newest that
loads), the checkpoints it writes, ``metrics.jsonl`` with the trackers of ``--report-to``, and
``config_history.jsonl``, which records every start, resume and stop. Under ``torchrun`` rank 0
alone writes; every rank learns the outcome of opening the folder, so a group stops together.
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from entrogym.train.config import TrainConfig
from entrogym.train.devices import distributed
from entrogym.train.folder.checkpoint import (
    CheckpointWarning,
    intact_checkpoints,
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from entrogym.train.folder.metrics import MetricsLogger
from entrogym.train.folder.safety import (
    NothingToDo,
    RunFileError,
    RunFolder,
    open_run_folder,
    write_error,
)
from entrogym.train.folder.state import TrainState
from entrogym.train.folder.trackers import Trackers, parse_report_to
from entrogym.train.learner.update import Learner
from entrogym.train.shutdown import Interrupted


class Run:
    """The run folder of ``cfg.out``: :meth:`open` it first (before any model loads), then
    :meth:`load_weights` of the checkpoint to resume, :meth:`start_logging`, :meth:`log` and
    :meth:`save` as the run goes, :meth:`close` at the end."""

    def __init__(self, cfg: TrainConfig, ranks: distributed.Ranks) -> None:
        self.cfg, self.ranks = cfg, ranks
        self.dir = Path(cfg.out)
        self.folder: RunFolder | None = None
        self.logger: MetricsLogger | None = None
        self.saved: int | None = None  # the iteration of the newest checkpoint on disk
        self.resumed_from: Path | None = None  # the checkpoint the run goes on from
        self._resume_rows: int | None = None  # metrics rows to keep (None: a fresh file)
        self.stopped = False  # the run stopped early (record_stop)

    def open(self) -> Path | None:
        """Rank 0: check ``--out`` (a run of this experiment, or new), take its lock, and find
        the checkpoint to resume. Raises NothingToDo when that checkpoint already covers
        ``iterations``. Every rank gets the checkpoint path (shared filesystem)."""

        def open_folder() -> tuple[str, str | None]:
            self.folder = open_run_folder(self.dir, self.cfg.to_dict(), resume=self.cfg.resume)
            try:
                ckpt = latest_checkpoint(self.dir) if self.cfg.resume else None
            except BaseException:
                self.folder.release()
                raise
            if ckpt is not None and read_meta(ckpt)["iteration"] + 1 >= self.cfg.iterations:
                self.folder.release()
                return "done", (
                    f"entrogym train: {self.dir} already has checkpoint {ckpt.name}, which "
                    f"covers iterations={self.cfg.iterations}; nothing to do (pass a larger "
                    "--iterations to train on)"
                )
            return "resume", None if ckpt is None else str(ckpt)

        # Every rank learns the outcome, so a torchrun group stops together.
        outcome, value = distributed.on_main(open_folder, self.ranks)
        if outcome == "done":
            raise NothingToDo(value)
        return None if value is None else Path(value)

    def load_weights(
        self, newest: Path | None, model: torch.nn.Module, scaler: Any
    ) -> TrainState | None:
        """``--resume``: load the weights and loss scaler of ``newest`` into ``model`` and
        ``scaler`` (a damaged checkpoint falls back to the one before, with a warning) and
        return its trainer state; None when the run starts fresh. The optimizer state and the
        RNGs are restored later, from :attr:`resumed_from`."""
        if not self.cfg.resume:
            return None
        for ckpt in _newest_first(self.dir, newest):
            try:
                state = load_checkpoint(
                    ckpt, model=model, scaler=scaler, base_model=self.cfg.model, restore_rng=False
                )
            except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
                # Checkpoints written before checksums existed are checked by size only.
                warnings.warn(f"ignoring checkpoint {ckpt}: {exc}", CheckpointWarning, 2)
                continue
            resumed = TrainState.from_dict(state)
            self.saved, self.resumed_from = state["iteration"], ckpt
            self._resume_rows = resumed.metrics_rows
            self.say(f"entrogym train: resuming {self.dir} after iteration {state['iteration']}")
            return resumed
        self.say(f"entrogym train: no checkpoint in {self.dir}; starting from scratch")
        self._resume_rows = 0
        if self.folder is not None and self.folder.saved_config is not None:
            self.folder.restart = True  # its run learned nothing this one keeps: it starts over
        return None

    def start_logging(self, from_iteration: int) -> None:
        """Rank 0: open metrics.jsonl, TensorBoard and the other trackers of ``--report-to``
        (a resume keeps the rows of the iterations its checkpoint covers), and record the
        start in the history."""
        restart = self.folder.restart  # a run that stopped before its first checkpoint
        rows = 0 if restart else self._resume_rows
        resumed = self.resumed_from is not None
        names = parse_report_to(self.cfg.report_to)
        trackers = Trackers(names, self.dir, self.cfg.to_dict(), resume=resumed)
        self.logger = MetricsLogger(self.dir, resume_rows=rows,
                                    tensorboard="tensorboard" in names, trackers=trackers)  # fmt: skip
        event = "restart" if restart else "resume" if resumed else "start"
        self.folder.record(event, self.cfg.to_dict(), from_iteration=from_iteration)

    def log(self, row: dict[str, Any] | None, it: int) -> None:
        if self.logger is not None and row is not None:
            self.logger.log(row, step=it)

    def save(
        self,
        it: int,
        state: TrainState,
        learner: Learner,
        *,
        best: bool,
        rng: dict[str, Any] | None,
        sampler_weights: dict[int, Any] | None,
        gathered: dict[str, Any],
    ) -> None:
        """Rank 0: write checkpoint ``it`` of ``learner``'s weights, optimizer and scaler with
        ``state`` (``rng``: the RNG states to store, default now; ``gathered``: the weights and
        optimizer state under torchrun, gathered by every rank)."""
        state.metrics_rows = self.logger.rows
        try:
            save_checkpoint(
                self.dir,
                it,
                model=learner.policy,
                optimizer=learner.optimizer,
                scaler=learner.scaler,
                state=state.to_dict(),
                base_model=self.cfg.model,
                best=best,
                rng=rng,
                sampler_weights=sampler_weights,
                **gathered,
            )
        except OSError as exc:
            raise write_error(exc, str(self.dir / "checkpoints")) from exc
        self.saved = it

    def record_stop(self, exc: BaseException) -> None:
        """Append why the run stopped to the history (best effort: the error itself may be
        that the folder cannot be written)."""
        self.stopped = True
        if self.folder is None or not self.ranks.main:
            return
        event = "interrupted" if isinstance(exc, Interrupted) else "stopped"
        with contextlib.suppress(RunFileError):
            self.folder.record_event(event, saved_iteration=self.saved, reason=str(exc))

    def say(self, message: str, **kwargs: Any) -> None:
        """Print on rank 0 (a torchrun group says things once)."""
        if self.ranks.main:
            print(message, flush=True, **kwargs)

    def close(self) -> None:
        """Close the metrics and trackers and release the folder's lock."""
        if self.logger is not None:
            self.logger.close(quiet=self.stopped)  # the stop's own line is the one to read
        if self.folder is not None:
            self.folder.release()


def _newest_first(run_dir: Path, newest: Path | None) -> Iterator[Path]:
    """``newest`` (already verified), then the older intact checkpoints, verified only if
    asked for (when loading ``newest`` fails)."""
    if newest is None:
        return
    yield newest
    yield from (c for c in intact_checkpoints(run_dir) if c.name < newest.name)
