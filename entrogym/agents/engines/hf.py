"""``transformers`` generate with a ``peft`` adapter: for tiny test models and machines without vLLM.

Prompts are left-padded into one batch; the per-token log-probs are ``log_softmax`` of the
model's raw logits at each sampled id (the same quantity vLLM reports by default). They are
taken step by step (``SampledLogprobs``) rather than from ``output_logits=True``, which keeps
every step's [batch, vocab] logits until the end and made generation about a third slower.

``transformers`` fills every sampling setting left unset (None) from the checkpoint's
``generation_config`` and then from its global defaults, which include ``top_k=50``: a sampler
that passes ``top_k=None`` draws from the 50 likeliest tokens only, not from the policy. So the
model's own generation config is replaced by a neutral one and every setting is stated.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import torch

from entrogym.agents.engines.adapter_slots import load_into_slot
from entrogym.agents.engines.base import Completion, Engine, SamplingParams, engine_dtype
from entrogym.agents.engines.draws import STATIC_DRAWS
from entrogym.agents.engines.hf_outputs import SampledLogprobs, completions
from entrogym.agents.engines.hf_sizing import HF_BATCH_BYTES, KEPT_CACHE_BYTES, hf_max_num_seqs
from entrogym.agents.engines.kinds import DECODE_PATHS
from entrogym.agents.engines.sampling_copy import adapter_unsupported_reason
from entrogym.agents.engines.shared_weights import model_on_tensors
from entrogym.agents.engines.static_decode import StaticDecoder, unsupported_reason
from entrogym.agents.engines.turn_cache import KeptCaches
from entrogym.agents.engines.vllm_engine import adapter_key

log = logging.getLogger(__name__)
__all__ = ["HF_BATCH_BYTES", "KEPT_CACHE_BYTES", "HFEngine", "hf_max_num_seqs"]


class HFEngine(Engine):
    """Args: ``model`` (folder or hub id), ``dtype``, ``max_model_len``, ``seed`` (torch's global
    seed at start), ``device``, ``max_num_seqs`` (sequences per ``generate`` batch; None =
    :func:`hf_max_num_seqs`, sized from the model and ``max_model_len``): a call with more
    prompts runs them batch after batch, so its memory is bounded whatever it is given;
    ``max_loras``: adapters kept loaded at once (the least recently used one goes first);
    ``base_weights``: the frozen base model's tensors of a LoRA learner in this process
    (:func:`~entrogym.agents.engines.shared_weights.frozen_base_tensors`), sampled with instead
    of a second copy loaded from ``model`` when their dtypes are the engine's (``shares_weights``
    says whether they were); ``decode``: ``generate`` (``transformers`` generate through
    peft's LoRA layers), ``static`` (merged adapter weights and a static KV cache,
    :mod:`~entrogym.agents.engines.static_decode`, for Llama-style models; others fall back to
    ``generate`` with a warning) or ``static-cdf`` (the same, with an inverse-CDF draw: the
    same distribution, not ``generate``'s tokens under a seed); ``keep_cache``: on the static
    paths, keep each conversation's key/value cache between calls under ``generate``'s
    ``cache_keys`` (:mod:`~entrogym.agents.engines.turn_cache`), within ``kept_cache_bytes``
    (None = :data:`KEPT_CACHE_BYTES`), so that a conversation's next turn prefills only the
    ids it adds; False prefills every prompt whole."""

    kind = "hf"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "fp32",
        max_model_len: int = 4096,
        seed: int = 0,
        device: str = "cpu",
        max_num_seqs: int | None = None,
        max_loras: int = 1,
        base_weights: Mapping[str, torch.Tensor] | None = None,
        decode: str = "generate",
        keep_cache: bool = True,
        kept_cache_bytes: int | None = None,
    ) -> None:
        super().__init__(model, max_model_len, seed, max_loras, max_num_seqs)
        if decode not in DECODE_PATHS:
            raise ValueError(f"decode must be one of {list(DECODE_PATHS)}, got {decode!r}")
        self.decode = decode
        name = engine_dtype(dtype)
        self.dtype = torch.float32 if name == "auto" else getattr(torch, name)
        self.device = torch.device(device)
        self.max_num_seqs = max_num_seqs or hf_max_num_seqs(self.model, dtype, max_model_len)
        self._model: Any = None
        self._base_weights = base_weights
        self.shares_weights = False
        self._adapters: dict[tuple[str, int], str] = {}
        # static decoders by adapter key (None = the base), the most recently used last
        self._decoders: dict[tuple[str, int] | None, StaticDecoder] = {}
        self._loaded = 0  # adapters loaded so far: names must never repeat
        self.keep_cache = bool(keep_cache)
        self._kept = KeptCaches(KEPT_CACHE_BYTES if kept_cache_bytes is None else kept_cache_bytes)
        self._start()

    @property
    def reuses_prefixes(self) -> bool:  # type: ignore[override]
        """Whether prompts under a cache key prefill only what they add (the static paths)."""
        return self.keep_cache and self.decode != "generate"

    @property
    def kept_cache_stats(self) -> dict[str, int]:
        """Keyed prompts that reused a kept cache (``hits``), that did not (``misses``), the
        tokens reused, the conversations kept and the bytes their caches hold."""
        kept = self._kept
        return {"hits": kept.hits, "misses": kept.misses, "reused_tokens": kept.reused_tokens,
                "conversations": len(kept), "bytes": kept.held_bytes()}  # fmt: skip

    def forget(self, keys: Sequence[Hashable] | None = None) -> None:
        self._kept.forget(keys)

    def _start(self) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        torch.manual_seed(self.seed)
        self._model = self._shared_model()
        self.shares_weights = self._model is not None
        if self._model is None:
            self._model = AutoModelForCausalLM.from_pretrained(self.model, dtype=self.dtype)
        self._model.to(self.device).eval()
        self._eos = _as_list(self._model.generation_config.eos_token_id) or _as_list(
            self._model.config.eos_token_id
        )
        pad = self._model.generation_config.pad_token_id
        self._pad = int(pad if pad is not None else (self._eos[0] if self._eos else 0))
        # Sampling settings come from SamplingParams only, never from the checkpoint: generate
        # fills our config's unset fields from the model's, so the model's is made neutral too.
        self._gen_config = GenerationConfig(pad_token_id=self._pad, bos_token_id=None)
        self._model.generation_config = copy.deepcopy(self._gen_config)
        self._adapters.clear()
        self._decoders.clear()
        self._kept.forget()
        reason = unsupported_reason(self._model.config) if self.decode != "generate" else None
        if reason is not None:
            log.warning(
                "hf engine: decode=%r does not support %s (%s); sampling with generate instead",
                self.decode,
                self.model,
                reason,
            )
            self.decode = "generate"

    def _shared_model(self) -> Any:
        """The model around ``base_weights``; None when there are none, or when they do not fit
        the engine (another dtype or device: the engine then loads its own copy)."""
        weights = self._base_weights
        if not weights or any(t.device != self.device for t in weights.values()):
            return None
        try:
            return model_on_tensors(self.model, self.dtype, weights)
        except ValueError:
            return None

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Sampling from torch's generator seeded with ``seed``; the global one is restored
        after, so a trainer's own random stream is not moved by an evaluation. Loading an
        adapter draws nothing from torch's streams, inside the scope or not (peft initialises
        new LoRA layers at random before it loads their weights), so the samples do not depend
        on which adapters the engine already held."""
        with self._own_stream():
            torch.manual_seed(seed)
            yield

    def _own_stream(self) -> contextlib.AbstractContextManager[None]:
        """A scope that restores torch's global generators (CPU, and this engine's GPU) after."""
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        return torch.random.fork_rng(devices=devices)

    def _shutdown(self) -> None:
        self._model = None
        self._adapters.clear()
        self._decoders.clear()
        self._kept.forget()

    def _select_adapter(self, adapter: str | None) -> Any:
        """The module to sample with: the base model, or a peft model with ``adapter`` active."""
        from peft import PeftModel

        if adapter is None:
            return self._model
        key = adapter_key(adapter)
        name = self._adapters.pop(key, None)
        if name is None and len(self._adapters) >= self.max_loras:
            # the version about to be evicted lends its layers, when its config is the same
            oldest = next(iter(self._adapters))
            if load_into_slot(self._model, adapter, self._adapters[oldest], self.device):
                name = self._adapters.pop(oldest)
                self._decoders.pop(oldest, None)
                self._kept.keep_owners({id(d) for d in self._decoders.values()})
        if name is None:
            self._loaded += 1
            name = f"adapter-{self._loaded}"
            # peft draws the new layers' initial values from torch's global stream before it
            # copies the saved ones in: isolated, so that what a run samples does not depend on
            # whether a version was loaded anew or into an evicted version's layers
            with self._own_stream():
                if isinstance(self._model, PeftModel):
                    self._model.load_adapter(adapter, adapter_name=name)
                else:
                    self._model = PeftModel.from_pretrained(self._model, adapter, adapter_name=name)
            self._model.eval()
        self._adapters[key] = name  # the most recently used last
        self._model.set_adapter(name)
        while len(self._adapters) > self.max_loras:  # at most max_loras, as vLLM keeps
            oldest = next(iter(self._adapters))
            self._model.delete_adapter(self._adapters.pop(oldest))
        return self._model

    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        return self._generate_keyed(prompts, params, adapter, [None] * len(prompts))

    @torch.no_grad()
    def _generate_keyed(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None,
        keys: list[Hashable | None],
    ) -> list[Completion]:  # fmt: skip
        from peft import PeftModel

        if self.decode != "generate":
            decoder = self._static_decoder(adapter)
            if decoder is not None:
                return _in_groups(
                    self._static_batch(decoder), prompts, params, keys, self.max_num_seqs
                )
        model = self._select_adapter(adapter)
        # LoRA layers live inside the base modules: the base model needs them switched off.
        off = adapter is None and isinstance(model, PeftModel)
        with model.disable_adapter() if off else contextlib.nullcontext():
            return _in_groups(
                lambda ids, ps, _keys: self._generate_batch(model, ids, ps),
                prompts, params, keys, self.max_num_seqs,
            )  # fmt: skip

    def _static_decoder(self, adapter: str | None) -> StaticDecoder | None:
        """The decoder with ``adapter`` merged in: built once per adapter version and kept
        for the ``max_loras`` most recently used (plus the base); None (sample with
        ``generate``) for an adapter that cannot be merged."""
        key = None if adapter is None else adapter_key(adapter)
        decoder = self._decoders.pop(key, None)
        if decoder is None:
            if key is not None:  # make room first: max_loras merged versions at most, not
                self._drop_decoders(keep=self.max_loras - 1)  # one more while one is merged
            model = self._select_adapter(adapter)
            name = None if adapter is None else self._adapters[key]
            reason = None if name is None else adapter_unsupported_reason(model.peft_config[name])
            if reason is not None:
                log.warning(
                    "hf engine: adapter %s cannot be merged (%s); sampling it with generate",
                    adapter,
                    reason,
                )
                return None
            decoder = StaticDecoder(model, name)
        self._decoders[key] = decoder
        self._drop_decoders(keep=self.max_loras)
        return decoder

    def release_caches(self) -> None:
        """Drop every merged copy of the weights (with its KV caches, those kept between calls
        too): one model's worth of memory per adapter version held. In a synchronous run the
        next rollouts sample a new version, so nothing is merged twice."""
        self._decoders.clear()
        self._kept.forget()

    def _drop_decoders(self, keep: int) -> None:
        """Keep the ``keep`` most recently used adapters' decoders (and the base's); the caches
        kept by the others go with them (another version's keys and values)."""
        adapters = [k for k in self._decoders if k is not None]
        for oldest in adapters[: max(0, len(adapters) - keep)]:
            del self._decoders[oldest]
        self._kept.keep_owners({id(d) for d in self._decoders.values()})

    def _static_batch(self, decoder: StaticDecoder) -> Batch:
        def run(
            prompts: list[list[int]], params: list[SamplingParams], keys: list[Hashable | None]
        ) -> list[Completion]:
            p = params[0]
            stops = [] if p.ignore_eos else sorted(set(self._eos) | set(p.stop_token_ids))
            if p.seed is not None:
                torch.manual_seed(p.seed)
            keep = self.keep_cache and any(k is not None for k in keys)
            kept = [self._kept.get(k, id(decoder)) for k in keys] if keep else None
            new, logprobs = decoder.sample(
                prompts,
                p,
                max(q.max_tokens for q in params),
                stops,
                self._pad,
                draw=STATIC_DRAWS[self.decode],
                kept=kept,
            )
            out = completions(new, logprobs, params, stops)
            if keep:
                self._kept.keep_call(decoder, keys, prompts, [c.token_ids for c in out])
            return out

        return run

    def _generate_batch(
        self, model: Any, prompts: list[list[int]], params: list[SamplingParams]
    ) -> list[Completion]:
        p = params[0]
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self._pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
        stops = [] if p.ignore_eos else sorted(set(self._eos) | set(p.stop_token_ids))
        config = copy.deepcopy(self._gen_config)
        config.update(
            do_sample=p.temperature > 0,
            max_new_tokens=max(q.max_tokens for q in params),
            eos_token_id=stops or None,
        )
        if p.temperature > 0:
            # top_k=0 switches the filter off; None would mean transformers' default of 50.
            config.update(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k)
        if p.seed is not None:
            torch.manual_seed(p.seed)
        from transformers import LogitsProcessorList

        recorder = SampledLogprobs()
        sequences = model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder]),
        )
        return completions(sequences[:, width:], recorder.finish(sequences), params, stops)


Batch = Callable[[list[list[int]], list[SamplingParams], list[Hashable | None]], list[Completion]]


def _in_groups(
    batch: Batch,
    prompts: list[list[int]],
    params: list[SamplingParams],
    keys: list[Hashable | None],
    size: int,
) -> list[Completion]:
    """``batch`` called once per run of at most ``size`` prompts sharing sampling settings
    (``max_tokens`` aside), the completions back in the prompts' order."""
    order = sorted(range(len(prompts)), key=lambda i: _settings(params[i]))
    results: dict[int, Completion] = {}
    start = 0
    while start < len(order):
        group = [order[start]]
        while (
            start + len(group) < len(order)
            and len(group) < size
            and _settings(params[order[start + len(group)]]) == _settings(params[group[0]])
        ):
            group.append(order[start + len(group)])
        start += len(group)
        done = batch(
            [prompts[i] for i in group], [params[i] for i in group], [keys[i] for i in group]
        )
        results.update(zip(group, done, strict=True))
    return [results[i] for i in range(len(prompts))]


def _settings(p: SamplingParams) -> tuple:
    return (p.temperature, p.top_p, p.top_k, p.stop_token_ids, p.seed, p.ignore_eos)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
