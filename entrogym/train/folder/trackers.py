"""Experiment trackers (``--report-to``): the metrics rows of a run, sent where users look.

``metrics.jsonl`` is the record; a tracker gets the same numeric fields of every row under the
same names and steps (eval rows under ``eval/``, as in TensorBoard), and the run's config once.
Each is an install extra but TensorBoard:

- ``tensorboard``: event files in ``RUN/tb/`` (a resume hides the events of the steps it logs
  again).
- ``wandb``: offline (``RUN/wandb/``) unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` names
  another mode; it says so once. A W&B server that does not answer within
  :data:`START_TIMEOUT_S` makes it fall back to offline the same way.
  ``wandb sync RUN/wandb/offline-run-*`` uploads it later.
- ``trackio``: trackio's local store (``$TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``;
  ``trackio show`` opens it), project ``entrogym``.
- ``mlflow``: a local SQLite store, ``RUN/mlflow.db`` (``mlflow ui --backend-store-uri
  sqlite:///RUN/mlflow.db``), unless ``MLFLOW_TRACKING_URI`` names another. MLflow refuses
  ``@`` in a name, so ``pass@1`` is logged there as ``pass_at_1``.

Each run's name is the run folder's name. A local store that cannot be written is refused
before the run starts (:func:`tracker_stores` names them). A tracker server is given
:data:`START_TIMEOUT_S` per request at start, without retries. A tracker that fails (at start
or mid-run) is reported once on stderr and switched off; the run goes on and
``metrics.jsonl`` keeps every row.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
NO_TRACKER = "none"
PROJECT = "entrogym"
TB_DIR = "tb"
# Remote trackers retry for minutes when their server does not answer (MLflow ~100 s, W&B
# 90 s): at start a run waits about this long for one, then goes on without it (wandb falls
# back to offline).
START_TIMEOUT_S = 5


def parse_report_to(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"tensorboard,wandb"`` (or a list) as a list of tracker names; ``none`` is an empty
    list. An unknown name is a ValueError naming the supported ones."""
    words = value.split(",") if isinstance(value, str) else list(value)
    names = [w.strip().lower() for w in words if w.strip()]
    if names == [NO_TRACKER]:
        return []
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise ValueError(
            f"report_to: unknown tracker(s) {unknown or [value]}; supported: "
            f"{', '.join(TRACKERS)} (comma-separated), or {NO_TRACKER}"
        )
    return list(dict.fromkeys(names))


def tracker_stores(names: list[str], run_dir: Path) -> list[tuple[str, Path]]:
    """Where the trackers of ``names`` write, each with what names it, so that a store that
    cannot be written is refused before the run starts instead of failing (or retrying for
    minutes) after the model has loaded. ``run_dir`` itself is checked as ``--out``; its
    ``tb/`` and ``wandb/`` are listed when they exist already (a resume)."""
    stores = [
        (f"--report-to {name}: {sub}", run_dir / sub)
        for name, sub in (("tensorboard", TB_DIR), ("wandb", "wandb"))
        if name in names and (run_dir / sub).is_dir()
    ]
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if "mlflow" in names and uri and (folder := _mlflow_folder(uri)) is not None:
        stores.append(("--report-to mlflow: the folder of MLFLOW_TRACKING_URI", folder))
    if "trackio" in names:
        from huggingface_hub.constants import HF_HOME

        trackio_dir = os.environ.get("TRACKIO_DIR") or Path(HF_HOME) / "trackio"
        stores.append(("--report-to trackio: TRACKIO_DIR", Path(trackio_dir)))
    return stores


def _mlflow_folder(uri: str) -> Path | None:
    """The folder an MLflow tracking URI writes in: a SQLite file's folder, a file store
    (``file:`` or a plain path); None for a server."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db
        return Path(uri.removeprefix("sqlite:///")).parent
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(uri) if parsed.scheme == "" else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _say(message: str) -> None:
    print(f"entrogym: {message}", file=sys.stderr, flush=True)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


class Tracker(ABC):
    """One tracker of one run: started once, fed scalars per step, closed at the end."""

    name = "tracker"

    @abstractmethod
    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None: ...

    @abstractmethod
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class TensorboardTracker(Tracker):
    """TensorBoard event files in ``RUN/tb``; ``purge_step`` hides the events of the steps a
    resume logs again."""

    name = "tensorboard"

    def __init__(self, purge_step: int | None = None) -> None:
        self.purge_step = purge_step

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        _hide_writer_thread_errors()
        self.writer = SummaryWriter(str(run_dir / TB_DIR), purge_step=self.purge_step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _hide_writer_thread_errors() -> None:
    """TensorBoard's writer thread raises a write error twice: in the thread, printed with its
    traceback by ``threading.excepthook``, and at the next write or close, where
    :class:`Trackers` reports it in one line. Keep the first quiet (once per process)."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    previous = threading.excepthook
    if getattr(previous, "entrogym_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.thread, _AsyncWriterThread):
            previous(args)

    hook.entrogym_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE")
        offline = f"wandb runs offline in {run_dir / 'wandb'}; upload it later with " + (
            f"`wandb sync {run_dir / 'wandb'}/offline-run-*`"
        )
        if not mode and not os.environ.get("WANDB_API_KEY"):
            mode = "offline"
            _say(f"wandb: no WANDB_API_KEY, so {offline}")
        try:
            self.run = self._init(wandb, run_dir, config, resume, mode)
        except (wandb.errors.Error, TimeoutError) as exc:  # no server: keep a local copy
            _say(f"wandb: could not start online ({_short(exc)}), so {offline}")
            self.run = self._init(wandb, run_dir, config, resume, "offline")

    @staticmethod
    def _init(wandb: Any, run_dir: Path, config: dict[str, Any], resume: bool, mode: str | None):
        return wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=run_dir.name + ("-resumed" if resume else ""),
            group=run_dir.name,
            dir=str(run_dir),
            config=config,
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, init_timeout=START_TIMEOUT_S),
        )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker(Tracker):
    name = "trackio"

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        import trackio

        with _quiet():  # trackio prints its dashboard hints to stdout on every start and finish
            self.run = trackio.init(
                project=os.environ.get("TRACKIO_PROJECT", PROJECT),
                name=run_dir.name + ("-resumed" if resume else ""),
                group=run_dir.name,
                config=config,
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        with _quiet():
            self.run.finish()


_MLFLOW_BAD = re.compile(r"[^\w.\- :/]")


def mlflow_name(name: str) -> str:
    """A metric name MLflow accepts (``pass@1`` -> ``pass_at_1``; other bad characters -> ``_``)."""
    return _MLFLOW_BAD.sub("_", name.replace("@", "_at_"))


class MlflowTracker(Tracker):
    name = "mlflow"

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        from mlflow.tracking import MlflowClient

        uri = (
            os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{(run_dir / 'mlflow.db').absolute()}"
        )
        self.client = MlflowClient(tracking_uri=uri)
        with _bounded_mlflow_requests():
            self._start_run(run_dir, config, resume)

    def _start_run(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        run = self.client.create_run(
            experiment_id, run_name=run_dir.name + ("-resumed" if resume else "")
        )
        self.run_id = run.info.run_id
        # MLflow params are strings of at most 6000 characters, one per config field
        params = {mlflow_name(k): str(v)[:6000] for k, v in _flat(config).items()}
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log(self, scalars: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(k), v, now, step) for k, v in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@contextlib.contextmanager
def _bounded_mlflow_requests() -> Iterator[None]:
    """MLflow's requests to a server without retries and with a :data:`START_TIMEOUT_S`
    timeout, unless the user set those; restored afterwards (mid-run logging keeps MLflow's
    defaults)."""
    bounds = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": str(START_TIMEOUT_S)}  # fmt: skip
    added = [k for k in bounds if k not in os.environ]
    os.environ.update({k: bounds[k] for k in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_CLASSES: dict[str, type[Tracker]] = {
    "wandb": WandbTracker,
    "trackio": TrackioTracker,
    "mlflow": MlflowTracker,
}


class Trackers:
    """The run's trackers. Every call is guarded: a tracker that raises is reported once and
    dropped, and the run goes on."""

    def __init__(self, names: list[str], run_dir: Path, config: dict[str, Any], resume: bool):
        self.run_dir, self.config, self.resume = run_dir, config, resume
        self.active: list[Tracker] = []
        for name in names:
            if name in _CLASSES:  # tensorboard: MetricsLogger adds it (it knows the purge step)
                self.add(_CLASSES[name]())

    def add(self, tracker: Tracker) -> None:
        """Start ``tracker`` and feed it from now on."""
        start = functools.partial(tracker.start, self.run_dir, self.config, self.resume)
        if self._guard(tracker, "start", start):
            self.active.append(tracker)

    def _guard(self, tracker: Tracker, what: str, call: Any, quiet: bool = False) -> bool:
        try:
            call()
        except Exception as exc:  # noqa: BLE001  (a tracker must never stop training)
            if not quiet:
                _say(
                    f"--report-to {tracker.name} failed at {what} ({_short(exc)}); "
                    f"{tracker.name} is off for the rest of this run (metrics.jsonl keeps "
                    "every row)"
                )
            if tracker in self.active:
                self.active.remove(tracker)
            return False
        return True

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tracker in list(self.active):
            self._guard(tracker, f"step {step}", lambda t=tracker: t.log(scalars, step))

    def close(self, quiet: bool = False) -> None:
        """Close every tracker. ``quiet``: the run is stopping on an error of its own, which
        is the line to read; a tracker that cannot close then (it writes in the same broken
        folder, or to the same dead server) is not reported."""
        for tracker in list(self.active):
            self._guard(tracker, "close", tracker.close, quiet=quiet)
        self.active = []
