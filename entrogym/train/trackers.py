"""Experiment trackers (``--report-to``): the metrics rows of a run, sent where users look.

``metrics.jsonl`` is the record; a tracker gets the same numeric fields of every row under the
same names and steps (eval rows under ``eval/``, as in TensorBoard), and the run's config once.
TensorBoard lives in :class:`entrogym.train.metrics.MetricsLogger` itself; this module holds the
others, each an install extra:

- ``wandb``: offline (``RUN/wandb/``) unless ``WANDB_API_KEY`` is set or ``WANDB_MODE`` names
  another mode; it says so once. ``wandb sync RUN/wandb/offline-run-*`` uploads it later.
- ``trackio``: trackio's local store (``$TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``;
  ``trackio show`` opens it), project ``entrogym``.
- ``mlflow``: a local SQLite store, ``RUN/mlflow.db`` (``mlflow ui --backend-store-uri
  sqlite:///RUN/mlflow.db``), unless ``MLFLOW_TRACKING_URI`` names another. MLflow refuses
  ``@`` in a name, so ``pass@1`` is logged there as ``pass_at_1``.

Each run's name is the run folder's name. A tracker that fails (at start or mid-run) is
reported once on stderr and switched off; the run goes on and ``metrics.jsonl`` keeps every row.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
NO_TRACKER = "none"
PROJECT = "entrogym"


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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _say(message: str) -> None:
    print(f"entrogym: {message}", file=sys.stderr, flush=True)


class Tracker(ABC):
    """One tracker of one run: started once, fed scalars per step, closed at the end."""

    name = "tracker"

    @abstractmethod
    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None: ...

    @abstractmethod
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        import wandb

        mode = os.environ.get("WANDB_MODE")
        if not mode and not os.environ.get("WANDB_API_KEY"):
            mode = "offline"
            _say(
                f"wandb: no WANDB_API_KEY, so wandb runs offline in {run_dir / 'wandb'}; "
                f"upload it later with `wandb sync {run_dir / 'wandb'}/offline-run-*`"
            )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=run_dir.name + ("-resumed" if resume else ""),
            group=run_dir.name,
            dir=str(run_dir),
            config=config,
            mode=mode,
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True),
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
    """The run's trackers other than TensorBoard. Every call is guarded: a tracker that raises
    is reported once and dropped, and the run goes on."""

    def __init__(self, names: list[str], run_dir: Path, config: dict[str, Any], resume: bool):
        self.active: list[Tracker] = []
        for name in names:
            if name not in _CLASSES:
                continue  # tensorboard: MetricsLogger's own
            tracker = _CLASSES[name]()
            if self._guard(tracker, "start", lambda t=tracker: t.start(run_dir, config, resume)):
                self.active.append(tracker)

    def _guard(self, tracker: Tracker, what: str, call: Any) -> bool:
        try:
            call()
        except Exception as exc:  # noqa: BLE001  (a tracker must never stop training)
            _say(
                f"--report-to {tracker.name} failed at {what} ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:300]}); {tracker.name} is off for the rest of "
                "this run, which goes on (metrics.jsonl keeps every row)"
            )
            if tracker in self.active:
                self.active.remove(tracker)
            return False
        return True

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tracker in list(self.active):
            self._guard(tracker, f"step {step}", lambda t=tracker: t.log(scalars, step))

    def close(self) -> None:
        for tracker in list(self.active):
            self._guard(tracker, "close", tracker.close)
        self.active = []
