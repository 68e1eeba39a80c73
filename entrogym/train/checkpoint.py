"""Atomic checkpoints of a training run, resume, and adapters for sequential training.

Layout under ``RUN/checkpoints/``::

    iter-000010/                 one complete checkpoint
      adapter/                   the LoRA adapter in peft format (``save_pretrained``);
                                 ``model.safetensors`` instead for a plain ``torch.nn.Module``
      trainer_state.pt           optimizer, scaler, trainer ``state`` dict, RNG states
      meta.json                  iteration, base model, entrogym version, file sizes, completed
    iter-000012.tmp-4711/        a save in progress (or killed): never read
    latest                       text: the folder name of the newest checkpoint
    best                         text: the folder name of the best checkpoint (``mark_best``)

A checkpoint is written into a ``.tmp-<pid>`` folder, every file fsynced, ``meta.json``
last, then renamed into place with ``os.replace``: a crash or a full disk at any moment leaves
either the old set of checkpoints or the old set plus one complete new one. ``latest`` is only
a hint for people and tools; :func:`latest_checkpoint` scans the folders and verifies them.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from entrogym.atomic import atomic_write_text, fsync_dir
from entrogym.train import distributed

CHECKPOINTS_DIR = "checkpoints"
_NAME_RE = re.compile(r"^iter-(\d{6,})$")
_TMP_RE = re.compile(r"^(?:iter-\d{6,}|latest|best)\.(?:tmp|old)-(\d+)$")
_ADAPTER_DIR = "adapter"
_STATE_FILE = "trainer_state.pt"
_META_FILE = "meta.json"
_PLAIN_WEIGHTS = "model.safetensors"


class CheckpointWarning(UserWarning):
    """A checkpoint folder was skipped because it is incomplete or corrupt."""


def checkpoint_name(iteration: int) -> str:
    if iteration < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    return f"iter-{iteration:06d}"


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(dirpath))


# ----------------------------------------------------------------------------- RNG states


def rng_state() -> dict[str, Any]:
    """The global RNG states of python ``random``, numpy and torch, as tensors and plain types.

    Plain containers keep ``torch.load(weights_only=True)`` usable on the checkpoint.
    """
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npst["bit_generator"],
            "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            warnings.warn(
                f"checkpoint holds CUDA RNG states for {len(cuda_states)} devices but "
                f"{torch.cuda.device_count()} are visible; CUDA RNG not restored",
                CheckpointWarning,
                stacklevel=2,
            )


# ----------------------------------------------------------------------------- weights


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "save_pretrained")


def _save_weights(
    model: torch.nn.Module, folder: Path, weights: dict[str, torch.Tensor] | None
) -> None:
    if _is_peft(model):
        model.save_pretrained(str(folder / _ADAPTER_DIR), state_dict=weights)
        return
    from safetensors.torch import save_file

    (folder / _ADAPTER_DIR).mkdir()
    source = model.state_dict() if weights is None else weights
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in source.items()}
    save_file(tensors, str(folder / _ADAPTER_DIR / _PLAIN_WEIGHTS))


def _load_weights(model: torch.nn.Module, adapter_dir: Path, *, what: str) -> None:
    if _is_peft(model):
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        if not (adapter_dir / "adapter_config.json").is_file():
            raise ValueError(f"{what}: {adapter_dir} holds no peft adapter (adapter_config.json)")
        weights = load_peft_weights(str(adapter_dir), device="cpu")
        try:
            result = set_peft_model_state_dict(model, weights)
        except RuntimeError as exc:  # size mismatch: another rank or another base model
            raise ValueError(
                f"{what}: the adapter in {adapter_dir} does not fit this model ({exc}). "
                "Use an adapter trained on the same base model with the same LoRA settings."
            ) from exc
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"{what}: the adapter in {adapter_dir} does not match this model's LoRA layers "
                f"(unexpected: {list(result.unexpected_keys)[:5]}, missing: {missing[:5]}). "
                "Use the same LoRA rank and target modules as the run that saved it."
            )
        return
    from safetensors.torch import load_file

    weights_file = adapter_dir / _PLAIN_WEIGHTS
    if not weights_file.is_file():
        raise ValueError(f"{what}: {adapter_dir} has no {_PLAIN_WEIGHTS} for a plain torch module")
    model.load_state_dict(load_file(str(weights_file)))


# ----------------------------------------------------------------------------- save


def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != _META_FILE
    }


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(ckpt_dir: Path) -> None:
    # Folders of saves that were killed (their process is gone) are never read; drop them.
    for entry in ckpt_dir.iterdir():
        m = _TMP_RE.match(entry.name)
        if m and (int(m.group(1)) == os.getpid() or not _pid_alive(int(m.group(1)))):
            final = ckpt_dir / entry.name.split(".")[0]
            if ".old-" in entry.name and entry.is_dir() and not final.exists():
                os.replace(entry, final)  # killed mid-swap of a re-saved iteration: put it back
            elif entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


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
) -> Path:
    """Write checkpoint ``iteration`` of a run atomically and return its folder.

    ``state`` is the trainer's JSON-able dict (controller states, target entropy, metrics
    offset, ...). The RNG states are captured at the moment of the call, so a resumed run
    draws the same numbers the uninterrupted one drew next. Keeps the newest ``keep``
    checkpoints plus the best one. On any error (a full disk) the partial folder is removed,
    the previous checkpoints and ``latest`` stay as they were, and the error is re-raised.

    ``weights`` and ``optimizer_state`` are the gathered states of an FSDP2-sharded model (see
    ``entrogym.train.distributed``); without them they are read from ``model`` and
    ``optimizer``. The optimizer state is keyed by parameter name either way, so checkpoints
    move freely between one process and a torchrun group.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    try:
        json.dumps(state)
    except TypeError as exc:
        raise ValueError(
            f"state must be JSON-serialisable (it goes into the checkpoint): {exc}"
        ) from exc
    rng = rng_state()  # before anything below could draw random numbers
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(ckpt_dir)
    name = checkpoint_name(iteration)
    final = ckpt_dir / name
    tmp = ckpt_dir / f"{name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        _save_weights(model, tmp, weights)
        if optimizer_state is None and optimizer is not None:
            optimizer_state = distributed.optimizer_state(model, optimizer, distributed.Ranks())
        torch.save(
            {
                "iteration": iteration,
                "optimizer": optimizer_state,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "state": state,
                "rng": rng,
            },
            tmp / _STATE_FILE,
        )
        meta = {
            "iteration": iteration,
            "base_model": base_model,
            "entrogym_version": _version(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": _file_sizes(tmp),
            "completed": True,
        }
        (tmp / _META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(tmp)
        if final.exists():  # saving the same iteration twice: the newer save wins
            old = ckpt_dir / f"{name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(ckpt_dir)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        old = ckpt_dir / f"{name}.old-{os.getpid()}"
        if old.exists() and not final.exists():  # failed mid-swap: put the earlier save back
            os.replace(old, final)
        if isinstance(exc, OSError):
            exc.add_note(
                f"entrogym: checkpoint {name} was not written; earlier checkpoints in {ckpt_dir} "
                "are intact."
            )
        raise
    atomic_write_text(ckpt_dir / "latest", name + "\n")
    if best:
        atomic_write_text(ckpt_dir / "best", name + "\n")
    _prune(ckpt_dir, keep)
    return final


def mark_best(run_dir: str | os.PathLike[str], iteration: int, *, keep: int | None = 3) -> Path:
    """Record checkpoint ``iteration`` as the run's best (what ``--init-adapter RUN`` uses)."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    path = ckpt_dir / checkpoint_name(iteration)
    problem = _problem(path)
    if problem:
        raise ValueError(
            f"mark_best: checkpoint {path} is not usable ({problem}); save it before marking it"
        )
    atomic_write_text(ckpt_dir / "best", path.name + "\n")
    if keep is not None:
        _prune(ckpt_dir, keep)
    return path


def _prune(ckpt_dir: Path, keep: int) -> None:
    complete = sorted(_iteration_folders(ckpt_dir), reverse=True)
    best = _read_pointer(ckpt_dir / "best")
    for _, path in complete[keep:]:
        if path.name != best:
            shutil.rmtree(path, ignore_errors=True)


def _version() -> str:
    from entrogym import __version__

    return __version__


# ----------------------------------------------------------------------------- find


def _problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None when it is one."""
    if not path.is_dir():
        return "no such folder"
    try:
        meta = json.loads((path / _META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{_META_FILE} missing (save interrupted)"
    except (OSError, ValueError) as exc:
        return f"{_META_FILE} unreadable ({exc})"
    if not isinstance(meta, dict) or meta.get("completed") is not True:
        return f"{_META_FILE} does not say completed"
    m = _NAME_RE.match(path.name)
    if m and int(m.group(1)) != meta.get("iteration"):
        return f"{_META_FILE} says iteration {meta.get('iteration')}, folder says {int(m.group(1))}"
    for rel, size in meta.get("files", {}).items():
        f = path / rel
        if not f.is_file():
            return f"{rel} missing"
        if f.stat().st_size != size:
            return f"{rel} has {f.stat().st_size} bytes, expected {size} (truncated?)"
    if not (path / _STATE_FILE).is_file():
        return f"{_STATE_FILE} missing"
    return None


def _iteration_folders(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """``(iteration, folder)`` of every complete checkpoint; warns about corrupt ones."""
    if not ckpt_dir.is_dir():
        return []
    found = []
    for entry in ckpt_dir.iterdir():
        m = _NAME_RE.match(entry.name)
        if not m:
            continue
        problem = _problem(entry)
        if problem:
            warnings.warn(
                f"ignoring checkpoint {entry}: {problem}", CheckpointWarning, stacklevel=3
            )
            continue
        found.append((int(m.group(1)), entry))
    return sorted(found)


def _read_pointer(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint of a run, or None; corrupt folders are skipped with a
    :class:`CheckpointWarning`."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    if ckpt_dir.is_dir():
        _remove_stale_tmp(ckpt_dir)
    folders = _iteration_folders(ckpt_dir)
    return folders[-1][1] if folders else None


def best_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint marked with :func:`mark_best`, or None (warns if it is unusable)."""
    ckpt_dir = Path(run_dir) / CHECKPOINTS_DIR
    name = _read_pointer(ckpt_dir / "best")
    if name is None:
        return None
    problem = _problem(ckpt_dir / name)
    if problem:
        warnings.warn(
            f"ignoring best checkpoint {ckpt_dir / name}: {problem}",
            CheckpointWarning,
            stacklevel=2,
        )
        return None
    return ckpt_dir / name


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``meta.json`` of a complete checkpoint; ValueError saying what is wrong otherwise."""
    path = Path(path)
    problem = _problem(path)
    if problem:
        raise ValueError(f"{path} is not a complete checkpoint: {problem}")
    return json.loads((path / _META_FILE).read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- load


def _same_model(a: str, b: str) -> bool:
    if a.rstrip("/") == b.rstrip("/"):
        return True
    return os.path.exists(a) and os.path.exists(b) and os.path.realpath(a) == os.path.realpath(b)


def _check_base_model(meta: dict[str, Any], base_model: str | None, path: Path) -> None:
    saved = meta.get("base_model")
    if base_model is not None and saved is not None and not _same_model(saved, base_model):
        raise ValueError(
            f"checkpoint {path} was trained on base model {saved!r}, but this run uses "
            f"{base_model!r}. Pass the same --model as the run that saved it, or start "
            "from the base model without this checkpoint."
        )


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
    if (path / CHECKPOINTS_DIR).is_dir() and not (path / _META_FILE).exists():
        found = latest_checkpoint(path)
        if found is None:
            raise ValueError(f"run folder {path} has no complete checkpoint to resume from")
        path = found
    meta = read_meta(path)
    _check_base_model(meta, base_model, path)
    saved = read_training_state(path)
    _load_weights(model, path / _ADAPTER_DIR, what=f"checkpoint {path}")
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
    return torch.load(Path(path) / _STATE_FILE, map_location="cpu", weights_only=True)


def resolve_adapter(source: str | os.PathLike[str]) -> Path:
    """The adapter folder meant by ``source``: a checkpoint folder, a run folder (its best
    checkpoint, else its latest) or a plain peft adapter folder."""
    src = Path(source)
    if not src.exists():
        raise ValueError(f"--init-adapter: {src} does not exist")
    if (src / CHECKPOINTS_DIR).is_dir():
        found = best_checkpoint(src) or latest_checkpoint(src)
        if found is None:
            raise ValueError(f"--init-adapter: run folder {src} has no complete checkpoint")
        src = found
    if (src / _META_FILE).exists() or _NAME_RE.match(src.name):
        read_meta(src)  # raises with the reason when incomplete
        return src / _ADAPTER_DIR
    if (src / "adapter_config.json").is_file() or (src / _PLAIN_WEIGHTS).is_file():
        return src
    raise ValueError(
        f"--init-adapter: {src} is neither a run folder, a checkpoint folder nor a peft "
        "adapter folder (adapter_config.json)"
    )


def load_adapter_into(
    model: torch.nn.Module,
    adapter_dir_or_checkpoint: str | os.PathLike[str],
    *,
    base_model: str | None = None,
) -> Path:
    """Load adapter weights only (no optimizer, RNG or counters) for ``--init-adapter``:
    the paper's sequential training starts a new run from another run's best checkpoint.
    Returns the adapter folder used."""
    adapter = resolve_adapter(adapter_dir_or_checkpoint)
    if adapter.name == _ADAPTER_DIR and (adapter.parent / _META_FILE).exists():
        _check_base_model(read_meta(adapter.parent), base_model, adapter.parent)
    _load_weights(model, adapter, what=f"--init-adapter {adapter_dir_or_checkpoint}")
    return adapter
