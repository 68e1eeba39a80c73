"""Checks a command runs before it loads any model: each bad input is one ValueError line.

An unknown env id, env kwargs the env refuses, a split the env does not have, a model that is
neither a built-in, a folder nor a hub id, an ``--out`` that is a file, cannot be written or
has a name too long for its filesystem, an unwritable ``$ENTROGYM_CACHE`` and an
``--init-adapter`` that does not fit the run all fail here in well under a second instead of
after the model has loaded. Values that need no file or registry are checked by the config
dataclasses themselves (``AgentConfig``, ``TrainConfig``).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_env_id(env_id: str, option: str = "env") -> None:
    """``env_id`` is registered (``module:id`` imports ``module`` first, as gymnasium.make does)
    or, as ``module:Class``, names a text env class or a TRL-style env class."""
    import gymnasium as gym

    import entrogym  # noqa: F401  (registers the built-in ids)
    from entrogym.algos.plugins import import_plugin
    from entrogym.envs import BUILTIN_ENV_IDS
    from entrogym.envs.resolve import resolve_env_id

    module, _, name = env_id.rpartition(":")
    if module:
        import_plugin(module, f"{option} {env_id!r}")
        try:
            name = resolve_env_id(env_id).rpartition(":")[2]  # an env class is registered
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    try:
        gym.spec(name)
    except gym.error.Error as exc:
        raise ValueError(
            f"{option} {env_id!r} is not a registered env ({exc}); built-in ids: "
            f"{', '.join(BUILTIN_ENV_IDS)}"
        ) from exc


def check_env_builds(
    env_id: str,
    env_kwargs: dict[str, Any],
    option: str = "env",
    *,
    split: str | None = None,
    split_option: str | None = None,
    held_out: bool = False,
) -> None:
    """The env can be made with ``env_kwargs`` (an unknown dataset or game, a missing extra, a
    bad keyword, an env of the user's that raises or exits while it is made) and, with ``split_option``, has ``split`` (:func:`_check_split`): one
    ValueError line, before the run folder is made or a model loads."""
    from entrogym.algos.plugins import describe_exception
    from entrogym.envs.base import make_text_env

    try:
        env = make_text_env(env_id, **env_kwargs)
    except (TypeError, FileNotFoundError) as exc:  # not a text env; a bad keyword; no data
        raise ValueError(f"{option} {env_id!r}: {exc}") from exc
    except (ValueError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - an env of the user's may raise or exit
        raise ValueError(
            f"{option} {env_id!r}: making the env raised {describe_exception(exc)}"
        ) from None
    try:
        if split_option is not None:
            _check_split(env, env_id, split, split_option, held_out)
    finally:
        env.close()


def check_model(model: str, served: bool = False) -> None:
    """``model`` is a built-in name, a Hugging Face folder or an ``org/name`` hub id (a served
    model, ``--engine-urls``, is whatever name the server gives it)."""
    from entrogym.models import BUILTIN_MODELS

    if served or model in BUILTIN_MODELS:
        return
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model folder {model!r} has no config.json (not a Hugging Face model)"
            )
        return
    if _HUB_ID.match(model) and not model.startswith((".", "/", "~")):
        return
    raise ValueError(
        f"model {model!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}), an existing "
        "Hugging Face folder, nor a hub id 'org/name'"
    )


def _check_split(env: Any, env_id: str, split: str | None, option: str, held_out: bool) -> None:
    """``env`` has ``split`` (None: its default split, or with ``held_out`` its held-out one,
    which must exist)."""
    from entrogym.envs.base import env_attr, task_ids_of

    if split is None:
        if held_out:
            from entrogym.train.evaluation.evaluate import held_out_split

            held_out_split(env)
        return
    splits = env_attr(env, "splits")
    if isinstance(splits, tuple | list) and splits:
        if split not in splits:
            raise ValueError(
                f"{option} {split!r}: env {env_id!r} has no such split (its splits: "
                f"{', '.join(map(str, splits))})"
            )
        return
    try:
        tasks = task_ids_of(env, split)
    except Exception as exc:  # noqa: BLE001 - whatever the env raises for an unknown split
        raise ValueError(f"{option} {split!r}: env {env_id!r} refuses it ({exc})") from exc
    if not tasks:
        raise ValueError(f"{option} {split!r}: env {env_id!r} has no tasks in it")


def check_path_length(path: str | os.PathLike, option: str, room: int = 100) -> None:
    """Every component of ``path`` still to be created fits its filesystem's name limit, and
    the whole path leaves ``room`` characters for the files written under it."""
    folder = Path(path).expanduser().absolute()
    existing = _nearest_existing(folder)
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in folder.relative_to(existing).parts:
        size = len(os.fsencode(part))
        if size > name_max:
            shown = part if len(part) <= 40 else part[:40] + "..."
            raise ValueError(
                f"{option}: the path component {shown!r} is {size} characters; this filesystem "
                f"allows at most {name_max}. Pass a shorter --{option.replace('_', '-')}"
            )
    if len(os.fsencode(str(folder))) + room > path_max:
        raise ValueError(
            f"{option} {str(path)!r} is too long: the files under it would pass this "
            f"filesystem's limit of {path_max} characters"
        )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # e.g. a name too long for the filesystem: it cannot exist
        return False


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: str | os.PathLike, option: str) -> None:
    """``path`` is a folder (or can become one) that this user can write."""
    folder = Path(path).expanduser()
    check_path_length(folder, option)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {str(path)!r} is a file, not a folder; pass a folder")
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        raise ValueError(f"{option} {str(path)!r}: {str(existing)!r} is a file, not a folder")
    # A real write, not os.access: root passes os.access everywhere, even where writes fail.
    try:
        probe = tempfile.mkdtemp(prefix=".entrogym-write-check-", dir=existing)
    except OSError as exc:
        raise ValueError(
            f"{option} {str(path)!r}: cannot write in {str(existing)!r} ({exc.strerror})"
        ) from exc
    os.rmdir(probe)


def check_model_fits(config: Any, lora_targets: list[str] | None = None) -> None:
    """What the model's own files say, checked before its weights load: ``max_context_tokens``
    within its context length, a chat template (the tokenizer's or ``--chat-template``),
    every LoRA target module among its layers (a skeleton on the meta device: no weights), and
    a template that renders tools for ``--tool-format template``.
    A hub id that is not on disk and a served model are not checked here."""
    from entrogym.models import BUILTIN_MODELS, model_limits, resolve_model

    if config.engine_urls:
        return
    if config.model not in BUILTIN_MODELS and not Path(config.model).expanduser().is_dir():
        return
    path = resolve_model(config.model)
    limits = model_limits(path)
    if limits.context is not None and config.max_context_tokens > limits.context:
        raise ValueError(
            f"max_context_tokens={config.max_context_tokens} exceeds the context length of "
            f"{config.model!r} ({limits.context}, from its config.json); lower "
            "--max-context-tokens (and --max-response-tokens)"
        )
    if config.chat_template is None:
        from transformers import AutoTokenizer

        from entrogym.agents.agent import no_chat_template_message

        template = getattr(AutoTokenizer.from_pretrained(path), "chat_template", None)
        if not template:
            raise ValueError(no_chat_template_message(config.model))
    else:
        template = Path(config.chat_template).read_text()
    from entrogym.agents.tool_format import resolve_tool_format

    resolve_tool_format(config.tool_format, template)  # --tool-format template needs its support
    if lora_targets is not None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from entrogym.train.learner.policy import missing_lora_targets

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        missing_lora_targets(skeleton, lora_targets)


def check_trackers(report_to: str, out: str | os.PathLike) -> None:
    """Every tracker of ``--report-to`` is installed (its extra is named otherwise), and every
    local store it writes can be written."""
    from entrogym.extras import require
    from entrogym.train.folder.trackers import parse_report_to, tracker_stores

    names = parse_report_to(report_to)
    for name in names:
        if name != "tensorboard":
            require(name)
    for what, folder in tracker_stores(names, Path(out).expanduser()):
        check_writable_dir(folder, what)


def check_cache() -> None:
    """The model cache (``$ENTROGYM_CACHE``) can be written: built-in models are prepared and
    locked there."""
    from entrogym.models import default_cache_dir

    check_writable_dir(default_cache_dir(), "ENTROGYM_CACHE")


def check_init_adapter(config: Any) -> None:
    """``init_adapter``, when set, is an adapter (or a run or checkpoint folder holding one)
    whose checksums, base model and LoRA settings fit the run."""
    from entrogym.train.folder.adapter_check import verify_adapter

    if config.init_adapter:
        lora = (config.lora_rank, config.lora_alpha, config.lora_target_modules)
        verify_adapter(config.init_adapter, config.model, option="init_adapter", lora=lora)


def check_run_inputs(config: Any) -> None:
    """Everything of a ``TrainConfig`` that can be checked without loading a model."""
    from entrogym.models import BUILTIN_MODELS

    check_env_id(config.env, "env")
    if config.eval_env is not None:
        check_env_id(config.eval_env, "eval_env")
    env_kwargs = config.env_kwargs_for(config.env, config.env_kwargs)
    check_env_builds(config.env, env_kwargs, "env", split=config.split, split_option="split")
    if config.eval_env is not None:
        check_env_builds(
            config.eval_env,
            config.env_kwargs_for(config.eval_env, config.eval_env_kwargs),
            "eval_env",
            split=config.eval_split,
            split_option="eval_split" if config.eval_every else None,
            held_out=True,
        )
    check_model(config.model, served=bool(config.engine_urls))
    check_writable_dir(config.out, "out")
    check_trackers(config.report_to, config.out)
    if config.model in BUILTIN_MODELS and not config.engine_urls:
        check_cache()
    check_init_adapter(config)
    check_model_fits(config, lora_targets=config.lora_target_modules)
