"""The engine interface: prompt token ids in; sampled ids, their log-probs and a finish reason out.

Every engine (in-process vLLM, ``vllm serve`` over HTTP, ``transformers`` generate) answers
:meth:`Engine.generate` with the same :class:`Completion` objects, so the agent and the rollout
loop never see which one runs. Ids are never re-tokenized on the way: the ids the engine
sampled are the ids the trainer scores.

A multi-turn conversation comes back to the engine each turn with its prompt grown by the last
completion and the env's reply. ``generate``'s optional ``cache_keys`` name each prompt's
conversation (an episode), so that an engine that keeps key/value caches between calls can
prefill only what a prompt adds to the ids it already holds for that key (:meth:`Engine.forget`
frees them). Reuse is decided on the ids alone, never on the key: only the longest common
prefix of the kept ids and the new prompt is reused, the rest is prefilled, and the
completions are those of a full prefill, up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FINISH_REASONS = ("stop", "length")
# torch dtype names as engines spell them; "auto" lets the engine use the checkpoint's dtype.
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp32": "float32",
    "float32": "float32",
    "fp16": "float16",
    "float16": "float16",
    "auto": "auto",
}


def engine_dtype(dtype: str) -> str:
    """``"bf16"`` -> ``"bfloat16"`` etc.; raises ValueError naming the choices."""
    try:
        return DTYPE_NAMES[str(dtype).lower()]
    except KeyError:
        raise ValueError(
            f"dtype must be one of {sorted(set(DTYPE_NAMES))}, got {dtype!r}"
        ) from None


@dataclass(frozen=True)
class SamplingParams:
    """What to sample for one prompt. ``top_k=0`` and ``top_p=1`` switch those filters off;
    ``temperature=0`` is greedy. Generation stops at the model's EOS and at ``stop_token_ids``
    (the stop token is kept in the completion); with ``ignore_eos`` at neither: every completion
    has ``max_tokens`` tokens (vLLM's ``ignore_eos``; for measuring engines at equal work)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass
class Completion:
    """One sampled continuation: ``logprobs[i]`` is the engine's log-prob of ``token_ids[i]``
    under the model's raw distribution (before temperature and top-k/p), as vLLM reports it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Completion: {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs"
            )


class EngineDied(RuntimeError):
    """The engine's process is gone; :meth:`Engine.generate` restarts it once."""


def positive_int(value: Any) -> bool:
    """Whether ``value`` is an int >= 1 (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


class Engine(ABC):
    """Base class: validation, adapter checks and restart-once live here; subclasses implement
    :meth:`_start`, :meth:`_shutdown` and :meth:`_generate`.

    The keywords every engine takes are checked and kept here, once (an engine hands them on in
    this order): ``max_model_len`` (prompt plus completion tokens, >= 2), ``seed``,
    ``max_loras`` (adapters kept loaded at once, >= 1) and ``max_num_seqs`` (most sequences
    generated at once, >= 1; None: the engine's own default)."""

    kind: str = "base"

    def __init__(
        self,
        model: str,
        max_model_len: int,
        seed: int = 0,
        max_loras: int = 1,
        max_num_seqs: int | None = None,
    ) -> None:
        if not isinstance(max_model_len, int) or max_model_len < 2:
            raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
        if not positive_int(max_loras):
            raise ValueError(f"max_loras must be a positive integer, got {max_loras!r}")
        if max_num_seqs is not None and not positive_int(max_num_seqs):
            raise ValueError(
                f"max_num_seqs must be a positive integer or None, got {max_num_seqs!r}"
            )
        self.model = str(model)
        self.max_model_len = max_model_len
        self.seed = seed
        self.max_loras = max_loras
        self.max_num_seqs = max_num_seqs
        self.restarts = 0
        self._closed = False

    # ----- what subclasses provide -----------------------------------------------------------

    @abstractmethod
    def _start(self) -> None: ...

    @abstractmethod
    def _shutdown(self) -> None: ...

    @abstractmethod
    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        """Raise :class:`EngineDied` when the engine process is gone (not for bad input)."""

    def _generate_keyed(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None,
        keys: list[Hashable | None],
    ) -> list[Completion]:
        """:meth:`_generate` with each prompt's cache key; engines that keep caches between
        calls override it. The default keeps nothing."""
        return self._generate(prompts, params, adapter)

    #: Whether a prompt that extends one the engine saw costs only the prefill of what it adds
    #: (a cache kept under ``cache_keys``, or vLLM's automatic prefix caching).
    reuses_prefixes: bool = False

    # ----- the public API ----------------------------------------------------------------------

    def seeded(self, seed: int) -> contextlib.AbstractContextManager[None]:
        """A scope whose sampling is reproducible from ``seed`` whatever was sampled before
        (evaluation runs in one). The default changes nothing: the vLLM engines draw from
        their own stream, seeded once when they start."""
        return contextlib.nullcontext()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        adapter: str | os.PathLike | None = None,
        *,
        cache_keys: Sequence[Hashable | None] | None = None,
    ) -> list[Completion]:
        """Sample one completion per prompt, with the LoRA ``adapter`` folder (None = base).

        ``params`` is one :class:`SamplingParams` for all prompts or one per prompt;
        ``max_tokens`` is lowered to what fits in ``max_model_len``. A prompt that leaves no room
        raises ValueError. If the engine dies it is restarted once; a second death raises.

        ``cache_keys``: one key per prompt (an episode id; None for a prompt of its own) under
        which an engine that keeps caches between calls keeps the prompt's and its
        completion's keys and values, for a later prompt under the same key that begins with
        those ids (the module docstring). Keys must be distinct within a call. Engines
        without such a cache ignore them.
        """
        if self._closed:
            raise RuntimeError(f"{self.kind} engine is closed; make a new one")
        batch = [self._check_prompt(i, p) for i, p in enumerate(prompts)]
        if isinstance(params, SamplingParams):
            params = [params] * len(batch)
        params = list(params)
        if len(params) != len(batch):
            raise ValueError(f"got {len(batch)} prompts but {len(params)} SamplingParams")
        params = [self._fit(p, len(ids)) for p, ids in zip(params, batch, strict=True)]
        keys = None if cache_keys is None else self._check_keys(cache_keys, len(batch))
        adapter_path = None if adapter is None else self.check_adapter(adapter)
        if not batch:
            return []

        def run() -> list[Completion]:
            if keys is None:
                return self._generate(batch, params, adapter_path)
            return self._generate_keyed(batch, params, adapter_path, keys)

        try:
            return run()
        except EngineDied as first:
            log.warning("%s engine died (%s); restarting it once", self.kind, first)
            self.restart()
            try:
                return run()
            except EngineDied as second:
                raise RuntimeError(
                    f"the {self.kind} engine for {self.model} died again after a restart: "
                    f"{second}; check its log and the machine's memory"
                ) from second

    def forget(self, keys: Sequence[Hashable] | None = None) -> None:  # noqa: B027 - optional
        """Drop what is kept under these cache keys (None: everything kept under any key): a
        rollout calls it for its episodes as they end. By default nothing is kept."""

    def release_caches(self) -> None:  # noqa: B027 - optional: by default nothing to free
        """Free what the engine keeps only to sample faster; the next :meth:`generate`
        rebuilds what it needs. A synchronous trainer calls it once an iteration's rollouts
        are in, so that the update's activations find that memory free. The default keeps
        everything: the vLLM engines manage their own memory."""

    def restart(self) -> None:
        self.restarts += 1
        try:
            self._shutdown()
        except Exception as e:  # a dead engine may fail to shut down cleanly
            log.warning("shutting down the dead %s engine failed: %s", self.kind, e)
        self._start()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- checks --------------------------------------------------------------------------

    def _check_prompt(self, i: int, prompt: Sequence[int]) -> list[int]:
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"prompt {i} is empty; pass at least one token id")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens, which leaves no room to generate within "
                f"max_model_len={self.max_model_len}; raise max_model_len or shorten the prompt"
            )
        return ids

    @staticmethod
    def _check_keys(keys: Sequence[Hashable | None], count: int) -> list[Hashable | None]:
        keys = list(keys)
        if len(keys) != count:
            raise ValueError(f"got {count} prompts but {len(keys)} cache_keys")
        named = [k for k in keys if k is not None]
        if len(set(named)) != len(named):
            raise ValueError("cache_keys must be distinct within one generate call")
        return keys

    def _fit(self, params: SamplingParams, prompt_len: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if params.max_tokens <= room:
            return params
        return SamplingParams(**{**params.__dict__, "max_tokens": room})

    def check_adapter(self, adapter: str | os.PathLike) -> str:
        """The adapter folder's absolute path, after checking it fits the base model."""
        return check_adapter(adapter, self.model)


def _safetensors_shapes(files: Sequence[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118  (safe_open has no __iter__)
                shapes[key] = tuple(st.get_slice(key).get_shape())
    return shapes


def adapter_rank(adapter: str | os.PathLike) -> int:
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    ranks = [
        int(config.get("r", 0)),
        *(int(v) for v in (config.get("rank_pattern") or {}).values()),
    ]
    return max(ranks)


# The adapter ranks vLLM accepts as max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds ``rank`` (24 -> 32):
    the run's LoRA rank can be any integer, vLLM's limit only one of :data:`VLLM_LORA_RANKS`."""
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"max_lora_rank must be a positive integer, got {rank!r}")
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(
        f"max_lora_rank={rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]}); "
        "use a smaller LoRA rank or the hf engine"
    )


def check_lora_rank(path: str, max_lora_rank: int, where: str) -> None:
    """ValueError if the adapter at ``path`` has a rank above ``max_lora_rank``."""
    rank = adapter_rank(path)
    if rank > max_lora_rank:
        raise ValueError(
            f"adapter {path!r} has LoRA rank {rank}, above {where}'s max_lora_rank="
            f"{max_lora_rank}; set the engine's max_lora_rank to at least {rank} (the "
            "max_lora_rank option, --max-lora-rank; by default the run's lora_rank)"
        )


def check_adapter(adapter: str | os.PathLike, base_model: str) -> str:
    """Check that ``adapter`` is a peft LoRA folder whose matrices fit ``base_model``'s layers.

    Every ``lora_A`` must have the input width and every ``lora_B`` the output width of the base
    weight it modifies; this catches an adapter trained for another model before an engine
    loads it (vLLM's own message for that is an opaque shape error deep in a worker).
    Returns the folder's absolute path.
    """
    folder = Path(adapter).expanduser().resolve()
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(
            f"adapter {str(adapter)!r} is not a peft adapter folder (no adapter_config.json); "
            "pass a folder written by save_pretrained / entrogym.train.learner.policy.save_adapter"
        )
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise ValueError(f"adapter {str(folder)!r} has no adapter_model.safetensors")
    base = Path(base_model)
    base_files = sorted(base.glob("*.safetensors")) if base.is_dir() else []
    if not base_files:
        return str(folder)  # a hub id or a .bin checkpoint: the engine's own check must do
    base_shapes = _safetensors_shapes(base_files)
    # Conv1D layers (GPT-2) store their weight as [in, out], not [out, in]: peft marks them
    transposed = bool(
        json.loads((folder / "adapter_config.json").read_text()).get("fan_in_fan_out")
    )
    for key, shape in _safetensors_shapes([weights]).items():
        for part, dim in ((".lora_A.", 1), (".lora_B.", 0)):
            if part not in key:
                continue
            module = key.split(part)[0].removeprefix("base_model.model.")
            target = base_shapes.get(module + ".weight")
            if target is None:
                raise ValueError(
                    f"adapter {str(folder)!r} modifies {module!r}, which base model "
                    f"{base_model!r} does not have; was it trained for another model?"
                )
            want = target[1 - dim if transposed else dim]
            if shape[dim] != want:
                raise ValueError(
                    f"adapter {str(folder)!r} does not match base model {base_model!r}: "
                    f"{key} has shape {list(shape)} but {module} needs width {want}; "
                    "use the adapter with the model it was trained on"
                )
    return str(folder)
