"""Run folders: one writer each, only our own runs resumed, the config checked on resume.

What a run folder guarantees (``docs/runs.md``, "Run folder safety"):

- **One writer.** The trainer holds an advisory ``fcntl.flock`` on ``RUN/.lock`` for its
  whole life and writes its pid into the file. A second trainer on the same folder fails at
  once, naming that pid. The kernel drops the lock when its holder dies, so a killed run
  never blocks the next one.
- **Only our runs.** A new run writes ``RUN/entrogym-run.json`` before anything else. A new
  run and ``--resume`` both refuse a folder that holds files but is not an entrogym run,
  before touching anything in it. Runs made before the marker existed are recognised by
  their layout (``config.yaml`` naming env, model and algo, next to ``checkpoints/`` or
  ``adapters/``). These read-only checks live in :mod:`entrogym.train.folder.layout`.
- **Starting over.** A run that stopped before its first checkpoint learned nothing a new
  config would contradict: a new start or a ``--resume`` in its folder starts it over, with
  changed values if need be (its rows are dropped; the history records a ``restart``).
- **One experiment per folder.** ``--resume`` compares the new config with the run's
  ``config.yaml`` and refuses changes to the experiment, listing them. Extending
  ``iterations`` and changing logging, eval, checkpointing or engine-location knobs is
  allowed. Every start, resume, restart and stop is appended to ``config_history.jsonl``
  with its time and changed fields, once it has happened; ``config.yaml`` is rewritten only
  when an allowed field changed.
- **Bounded adapters.** :func:`prune_adapters` keeps only the adapter versions the engine may
  still read.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import yaml

from entrogym.algos import AlgorithmConfig, algorithm_mapping, build_algorithm
from entrogym.atomic import atomic_write_text
from entrogym.localserver import pid_alive
from entrogym.train.folder.layout import (
    ADAPTERS_DIR,
    CONFIG_FILE,
    HISTORY_FILE,
    LOCK_FILE,
    MARKER_FILE,
    RunFolderError,
    check_usable,
    read_yaml,
)

MARKER_FORMAT = 1

# Fields a resume may change: they decide how long the run goes on, what is logged and
# evaluated, how often it checkpoints, and where and how fast the engine runs -- never what is
# learned (``engine_decode``'s two paths sample the same distribution).
# ``micro_batch_size`` and ``micro_batch_tokens`` are here too: they bound activation memory and
# do not change the update (gradients of a minibatch's micro-batches are accumulated), so a run
# may resume on a smaller GPU; float sums in another order can differ in the last bits.
RESUMABLE_FIELDS = frozenset(
    {
        "iterations",
        "out",
        "resume",
        "checkpoint_every",
        "sampler_entropy_check",
        "input_dependence_every",
        "score_layout",
        "action_only_head",
        "eval_env",
        "eval_env_kwargs",
        "eval_split",
        "eval_every",
        "eval_tasks",
        "eval_samples",
        "engine_urls",
        "engine_decode",
        "request_timeout",
        "threads",
        "max_lora_rank",
        "max_bad_steps",
        "max_bad_steps_in_row",
        "max_env_error_fraction",
        "micro_batch_size",
        "micro_batch_tokens",
        "report_to",
        "env_workers",
        "env_timeout",
        "env_max_memory_mb",
        "shutdown_grace",
    }
)
# Compared through the resolved preset (both config forms), not as raw values; ``resume`` is
# how a run was started, not a setting of the run.
_NOT_COMPARED = frozenset({"algo", "resume"})
_ADAPTER_RE = re.compile(r"^v(\d{6,})$")


class RunFolderBusy(RunFolderError):
    """Another live process holds the run folder's lock."""


class NothingToDo(Exception):
    """``--resume`` of a run whose checkpoints already cover the asked iterations."""


class RunFileError(RuntimeError):
    """A file or folder of the run could not be written; the message names it and what to do."""


def write_error(exc: OSError, what: str) -> RunFileError:
    """One line naming the path ``exc`` failed on (or ``what``) and what to do next."""
    path = exc.filename or what
    if exc.errno == errno.ENOSPC:
        text = " ".join(str(exc).split())
        if "No space left on device while" not in text:
            text = f"no space left on device while writing {path}"
        return RunFileError(f"{text}; free some space, then continue with --resume")
    reason = exc.strerror or str(exc)
    blocker = next(
        (p for p in (Path(path), *Path(path).parents) if p.exists() and not p.is_dir()), None
    )
    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and blocker is not None:
        path, reason = blocker, "a file is where a folder should be"
    return RunFileError(
        f"cannot write {path} ({reason}); make it writable, then continue with --resume "
        "(the rows already in metrics.jsonl are kept)"
    )


# ----------------------------------------------------------------------------- the lock


def _holder_message(path: Path, pid_text: str) -> str:
    pid = int(pid_text) if pid_text.isdigit() else None
    if pid is None:
        who = "another process"
    elif pid_alive(pid):
        who = f"another entrogym process (pid {pid})"
    else:
        # Another program that forked while holding it (entrogym's children drop it).
        who = f"a process left behind by pid {pid} (which has exited)"
    return (
        f"run folder {path} is in use by {who}: only one trainer may write a run folder. "
        "Wait for it to finish (or stop it), or pass another --out."
    )


# Locks this process holds. A flock belongs to the open file, which forked children share:
# a child that outlived a killed trainer would keep the folder locked. Children close their
# copy at fork (never LOCK_UN, which would unlock the parent's too).
_HELD: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_locks_in_child() -> None:
    for lock in list(_HELD):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_locks_in_child)


class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock``, holding this process's pid."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip()
            os.close(self._fd)
            self._fd = None
            raise RunFolderBusy(_holder_message(Path(run_dir), holder)) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        _HELD.add(self)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            _HELD.discard(self)


# ----------------------------------------------------------------------------- the marker


def _write_marker(run_dir: Path) -> None:
    from entrogym import __version__

    marker = {
        "format": MARKER_FORMAT,
        "entrogym_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic_write_text(run_dir / MARKER_FILE, json.dumps(marker, indent=2) + "\n")


# ----------------------------------------------------------------------------- config check


def saved_algorithm(config: dict[str, Any]) -> AlgorithmConfig:
    """The algorithm of a saved config (``config.yaml``, a checkpoint's, ``TrainConfig.to_dict``):
    its ``algo`` mapping (``algorithm_mapping``, or a preset with some knobs) read back once.
    A mapping this entrogym cannot read is a :class:`RunFolderError` naming it."""
    algo = config.get("algo")
    try:
        return build_algorithm(algo)
    except ValueError as exc:
        raise RunFolderError(f"config.yaml's algo {algo!r}: {exc}") from None


def config_differences(saved: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    """``{field: [saved, new]}`` for every field that differs (the algorithm as one field,
    compared by its resolved preset). A field only one side has (added or removed by another
    entrogym version) is not compared."""
    diffs: dict[str, list[Any]] = {}
    old_algo = algorithm_mapping(saved_algorithm(saved))
    new_algo = algorithm_mapping(saved_algorithm(new))
    if old_algo != new_algo:
        changed = {k: [old_algo[k], new_algo[k]] for k in old_algo if old_algo[k] != new_algo[k]}
        diffs["algo"] = [changed, "(resolved preset fields: [saved, new])"]
    for key in sorted((saved.keys() | new.keys()) - _NOT_COMPARED):
        if key in saved and key in new and saved[key] != new[key]:
            diffs[key] = [saved[key], new[key]]
    # A resume may not name init_adapter (the weights come from the checkpoint): its absence
    # means "as the run started", not a change.
    if new.get("init_adapter") is None:
        diffs.pop("init_adapter", None)
    return diffs


# Engines with the same sampler in another place: in-process vLLM and ``vllm serve``.
_SAME_SAMPLER = ({"vllm", "vllm-server"},)


def refused_changes(diffs: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The differences a resume may not make (all but :data:`RESUMABLE_FIELDS` and a move
    between engines that sample the same way)."""
    refused = {k: v for k, v in diffs.items() if k not in RESUMABLE_FIELDS}
    if "engine" in refused and any(set(refused["engine"]) <= same for same in _SAME_SAMPLER):
        del refused["engine"]
    return refused


def _format_diffs(diffs: dict[str, list[Any]]) -> str:
    lines = []
    for key, (old, new) in diffs.items():
        if key == "algo":
            parts = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in old.items())
            lines.append(f"  algo: {parts}")
        else:
            lines.append(f"  {key}: {old!r} -> {new!r}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the folder


class RunFolder:
    """An opened run folder: checked, locked, with its config recorded. ``restart``: it holds
    a run that stopped before its first checkpoint, which starts over (its config may
    change)."""

    def __init__(
        self, path: Path, lock: RunLock, saved_config: dict[str, Any] | None, restart: bool
    ) -> None:
        self.path = path
        self.lock = lock
        self.saved_config = saved_config
        self.restart = restart

    def record(self, event: str, config: dict[str, Any], **extra: Any) -> None:
        """Rewrite ``config.yaml`` if the config changed, then append ``event`` to the
        history (so a failed write leaves no record of an event that did not happen). A file
        that cannot be written is a :class:`RunFileError` naming it."""
        changed = config_differences(self.saved_config, config) if self.saved_config else {}
        if self.saved_config is None or changed:
            try:
                atomic_write_text(self.path / CONFIG_FILE, yaml.safe_dump(config))
            except OSError as exc:
                raise write_error(exc, str(self.path / CONFIG_FILE)) from exc
        entry: dict[str, Any] = {**extra, "changed": changed}
        if self.saved_config is None or self.restart:
            entry["config"] = config
        self.record_event(event, **entry)
        self.saved_config = config

    def record_event(self, event: str, **fields: Any) -> None:
        """Append one line to ``config_history.jsonl`` (RunFileError if it cannot be)."""
        entry = {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "pid": os.getpid(), **fields}  # fmt: skip
        path = self.path / HISTORY_FILE
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, default=str) + "\n")
        except OSError as exc:
            raise write_error(exc, str(path)) from exc

    def release(self) -> None:
        self.lock.release()


def open_run_folder(run_dir: str | os.PathLike[str], config: dict[str, Any], *, resume: bool):
    """Check ``run_dir`` for a run with ``config``, take its lock, and return the
    :class:`RunFolder`. Raises :class:`RunFolderError` (a ValueError) when the folder must not
    be used, :class:`RunFolderBusy` when another process writes it. Nothing is written before
    the checks pass; the marker is written first, then the lock is taken."""
    run_dir = Path(run_dir)
    check_usable(run_dir, resume)  # read-only: a refused folder is left as it was
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / MARKER_FILE).is_file():
            _write_marker(run_dir)
        lock = RunLock(run_dir)
    except OSError as exc:
        raise RunFolderError(f"--out {run_dir} is not writable ({exc})") from exc
    try:
        has_run, restart = check_usable(run_dir, resume)  # again under the lock: a writer
        # may have finished a run here between the first check and the lock
        saved = read_yaml(run_dir / CONFIG_FILE) if has_run else None
        if saved is not None and not isinstance(saved, dict):
            raise RunFolderError(f"{run_dir / CONFIG_FILE} is not a mapping; fix or remove it")
        # a run without a checkpoint learned nothing that a changed config would contradict
        refused = (
            refused_changes(config_differences(saved, config)) if saved and not restart else {}
        )
        if refused:
            raise RunFolderError(
                f"--resume: this config differs from the run in {run_dir} in fields that "
                f"change the experiment:\n{_format_diffs(refused)}\nResume with the run's own "
                "settings (only iterations, eval_*, checkpoint_every, engine location and "
                "logging knobs may change), or start a new run with another --out."
            )
    except BaseException:
        lock.release()
        raise
    return RunFolder(run_dir, lock, saved, restart)


# ----------------------------------------------------------------------------- adapters


def adapter_folder(run_dir: str | os.PathLike[str], version: int) -> Path:
    return Path(run_dir) / ADAPTERS_DIR / f"v{version:06d}"


def prune_adapters(run_dir: str | os.PathLike[str], current: int, keep: int = 2) -> list[Path]:
    """Remove ``adapters/vNNNNNN`` folders but the ``keep`` newest up to ``current``.

    The engine reads only the current version (rollouts and eval of the next iteration); the
    one before stays while a remote server may still be swapping it out. Checkpoints hold
    their own adapter copy, so none of them needs these folders. Versions above ``current``
    (left by a run that went further before it was killed) are stale and removed too.
    Returns the removed folders."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(run_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return []
    removed = []
    for entry in root.iterdir():
        m = _ADAPTER_RE.match(entry.name)
        if m and not current - keep < int(m.group(1)) <= current:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return sorted(removed)
