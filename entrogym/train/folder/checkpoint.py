"""Atomic checkpoints of a training run, resume, and adapters for sequential training.

Layout under ``RUN/checkpoints/``::

    iter-000010/                 one complete checkpoint
      adapter/                   the LoRA adapter in peft format (``save_pretrained``);
                                 ``model.safetensors`` instead for a plain ``torch.nn.Module``
      trainer_state.pt           optimizer, scaler, trainer ``state`` dict, RNG states
      meta.json                  iteration, base model, entrogym version, size and sha256 of
                                 every file, completed
    iter-000012.tmp-4711/        a save in progress (or killed): never read
    latest                       text: the folder name of the newest checkpoint
    best                         text: the folder name of the best checkpoint (``mark_best``)

A checkpoint is written into a ``.tmp-<pid>`` folder, every file fsynced, ``meta.json``
last, then renamed into place with ``os.replace``: a crash or a full disk at any moment leaves
either the old set of checkpoints or the old set plus one complete new one. ``latest`` is only
a hint for people and tools; :func:`latest_checkpoint` scans the folders and verifies them
(``entrogym.train.folder.checkpoint_verify``). A full disk is reported as one, whatever layer noticed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from entrogym.atomic import atomic_write_text, fsync_dir, swap_in_folder
from entrogym.train.devices import distributed
from entrogym.train.folder.adapter_files import finite_adapter_weights
from entrogym.train.folder.checkpoint_verify import (
    ADAPTER_DIR,
    CHECKPOINTS_DIR,
    META_FILE,
    STATE_FILE,
    CheckpointWarning,
    best_checkpoint,
    checkpoint_name,
    checkpoint_problem,
    complete_folders,
    file_manifest,
    intact_checkpoints,
    latest_checkpoint,
    read_meta,
    read_pointer,
    remove_stale_tmp,
)
from entrogym.train.folder.checkpoint_weights import (
    check_base_model,
    load_adapter_into,
    load_weights,
    resolve_adapter,
    save_weights,
)
from entrogym.train.folder.rng import rng_state, set_rng_state

__all__ = [
    "CHECKPOINTS_DIR",
    "CheckpointWarning",
    "best_checkpoint",
    "checkpoint_name",
    "disk_full",
    "intact_checkpoints",
    "latest_checkpoint",
    "load_adapter_into",
    "load_checkpoint",
    "mark_best",
    "read_meta",
    "read_training_state",
    "resolve_adapter",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(dirpath))


# ----------------------------------------------------------------------------- save


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` means the disk (or the quota) is full. torch's zip writer reports a
    short write as ``RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos``."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, RuntimeError) and "unexpected pos" in str(exc)


def _check_save_args(keep: int, state: dict[str, Any]) -> None:
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    try:
        json.dumps(state)
    except TypeError as exc:
        raise ValueError(
            f"state must be JSON-serialisable (it goes into the checkpoint): {exc}"
        ) from exc


def _write_folder(
    tmp: Path,
    iteration: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scaler: Any,
    state: dict[str, Any],
    rng: dict[str, Any],
    base_model: str,
    weights: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any] | None,
    sampler_weights: dict[int, dict[str, torch.Tensor]] | None = None,
) -> None:
    """Everything of one checkpoint into ``tmp``, ``meta.json`` (with checksums) last."""
    tmp.mkdir()
    save_weights(model, tmp, weights, base_model)
    if optimizer_state is None and optimizer is not None:
        optimizer_state = distributed.optimizer_state(model, optimizer, distributed.Ranks())
    torch.save(
        {
            "iteration": iteration,
            "optimizer": optimizer_state,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "state": state,
            "rng": rng,
            "sampler_weights": {str(v): w for v, w in (sampler_weights or {}).items()},
        },
        tmp / STATE_FILE,
    )
    meta = {
        "iteration": iteration,
        "base_model": base_model,
        "entrogym_version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": file_manifest(tmp),
        "completed": True,
    }
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    _fsync_tree(tmp)


def _parked(final: Path) -> Path:
    """Where a save of the same iteration parks the earlier one while it swaps in: named
    ``NAME.old-PID`` so that checkpoint_verify.remove_stale_tmp can put it back after a kill."""
    return final.with_name(f"{final.name}.old-{os.getpid()}")


def _undo_failed_save(tmp: Path, final: Path, exc: BaseException) -> BaseException:
    """Remove the partial folder, put back a swapped-out earlier save, and return the error
    to raise: a full disk says so, whatever layer noticed it."""
    shutil.rmtree(tmp, ignore_errors=True)
    old = _parked(final)
    if old.exists() and not final.exists():  # failed mid-swap: put the earlier save back
        os.replace(old, final)
    intact = f"earlier checkpoints in {final.parent} are intact."
    if disk_full(exc):
        full = OSError(
            errno.ENOSPC,
            f"No space left on device while writing checkpoint {final.name} to {final.parent} "
            f"({exc}); {intact} Free some space, then continue with --resume.",
        )
        full.add_note(f"entrogym: checkpoint {final.name} was not written; {intact}")
        return full
    if isinstance(exc, OSError):
        exc.add_note(f"entrogym: checkpoint {final.name} was not written; {intact}")
    return exc


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    iteration: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scaler: Any = None,
    state: dict[str, Any],
    base_model: str,
    keep: int = 3,
    best: bool = False,
    weights: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    rng: dict[str, Any] | None = None,
    sampler_weights: dict[int, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write checkpoint ``iteration`` of a run atomically and return its folder.

    ``state`` is the trainer's JSON-able dict (controller states, target entropy, metrics
    offset, ...). The RNG states are captured at the moment of the call, so a resumed run
    draws the same numbers the uninterrupted one drew next. Keeps the newest ``keep``
    checkpoints plus the best one. On any error the partial folder is removed, the previous
    checkpoints and ``latest`` stay as they were, and the error is raised (a full disk as
    ``OSError(ENOSPC, "No space left on device while writing checkpoint ...")``).

    ``weights`` and ``optimizer_state`` are the gathered states of an FSDP2-sharded model (see
    ``entrogym.train.devices.distributed``); without them they are read from ``model`` and
    ``optimizer``. The optimizer state is keyed by parameter name either way, so checkpoints
    move freely between one process and a torchrun group. ``rng`` replaces the RNG states of
    the moment with ones captured earlier (:func:`rng_state`), for a checkpoint of an
    iteration saved after the next one had begun drawing. ``sampler_weights`` are the
    trainable weights of older versions an async run still samples with
    (``entrogym.train.learner.versions``), by version.
    """
    _check_save_args(keep, state)
    finite_adapter_weights(model, weights, f"checkpoint {checkpoint_name(iteration)}")
    rng = rng or rng_state()  # before anything below could draw random numbers
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(ckpt_dir)
    name = checkpoint_name(iteration)
    final = ckpt_dir / name
    tmp = ckpt_dir / f"{name}.tmp-{os.getpid()}"
    try:
        _write_folder(
            tmp,
            iteration,
            model=model,
            optimizer=optimizer,
            scaler=scaler,
            state=state,
            rng=rng,
            base_model=base_model,
            weights=weights,
            optimizer_state=optimizer_state,
            sampler_weights=sampler_weights,
        )
        swap_in_folder(tmp, final, parked=_parked(final))
    except BaseException as exc:
        error = _undo_failed_save(tmp, final, exc)
        if error is exc:
            raise
        raise error from exc
    atomic_write_text(ckpt_dir / "latest", name + "\n")
    if best:
        atomic_write_text(ckpt_dir / "best", name + "\n")
    _prune(ckpt_dir, keep)
    return final


def mark_best(run_dir: str | os.PathLike[str], iteration: int, *, keep: int | None = 3) -> Path:
    """Record checkpoint ``iteration`` as the run's best (what ``--init-adapter RUN`` uses)."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    path = ckpt_dir / checkpoint_name(iteration)
    problem = checkpoint_problem(path)
    if problem:
        raise ValueError(
            f"mark_best: checkpoint {path} is not usable ({problem}); save it before marking it"
        )
    atomic_write_text(ckpt_dir / "best", path.name + "\n")
    if keep is not None:
        _prune(ckpt_dir, keep)
    return path


def _prune(ckpt_dir: Path, keep: int) -> None:
    complete = sorted(complete_folders(ckpt_dir), reverse=True)
    best = read_pointer(ckpt_dir / "best")
    for _, path in complete[keep:]:
        if path.name != best:
            shutil.rmtree(path, ignore_errors=True)


def _version() -> str:
    from entrogym import __version__

    return __version__


# ----------------------------------------------------------------------------- load


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any = None,
    base_model: str | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore a checkpoint into ``model`` (and ``optimizer``/``scaler``), and the RNG states.

    ``path`` is a checkpoint folder or a run folder (its latest checkpoint). Returns the
    trainer ``state`` dict that was saved, with ``"iteration"`` set to the saved iteration.
    Raises ValueError if ``base_model`` differs from the one the checkpoint was trained on.
    """
    path = Path(path)
    if (path / CHECKPOINTS_DIR).is_dir() and not (path / META_FILE).exists():
        found = latest_checkpoint(path)
        if found is None:
            raise ValueError(f"run folder {path} has no complete checkpoint to resume from")
        path = found
    meta = read_meta(path)
    check_base_model(meta, base_model, path)
    saved = read_training_state(path)
    load_weights(model, path / ADAPTER_DIR, what=f"checkpoint {path}")
    if optimizer is not None:
        if saved["optimizer"] is None:
            raise ValueError(f"checkpoint {path} holds no optimizer state")
        distributed.load_optimizer_state(model, optimizer, saved["optimizer"], distributed.Ranks())
    if scaler is not None and saved["scaler"]:
        scaler.load_state_dict(saved["scaler"])
    if restore_rng:
        set_rng_state(saved["rng"])
    return {**saved["state"], "iteration": int(saved["iteration"])}


def read_training_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's raw training state: iteration, optimizer, scaler, trainer state, RNG.

    For callers that restore the pieces at different moments (a torchrun learner loads the
    weights before FSDP2 shards the model and the optimizer state after)."""
    try:
        return torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # damaged bytes fail in many ways (IndexError, KeyError, ...)
        # One type for "this file does not load", so a resume can fall back to an older one.
        raise RuntimeError(
            f"checkpoint {path}: {STATE_FILE} does not load ({type(exc).__name__}: {exc})"
        ) from exc
