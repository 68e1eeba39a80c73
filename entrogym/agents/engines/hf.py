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
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from entrogym.agents.engines.adapter_slots import load_into_slot
from entrogym.agents.engines.base import Completion, Engine, SamplingParams, engine_dtype
from entrogym.agents.engines.draws import STATIC_DRAWS
from entrogym.agents.engines.kinds import DECODE_PATHS
from entrogym.agents.engines.sampling_copy import adapter_unsupported_reason
from entrogym.agents.engines.shared_weights import model_on_tensors
from entrogym.agents.engines.static_decode import StaticDecoder, unsupported_reason
from entrogym.agents.engines.vllm_engine import adapter_key

log = logging.getLogger(__name__)

# What one ``generate`` batch may hold at full context: its KV cache plus its logit buffers.
# 2 GiB fits 11 SmolLM2-135M sequences of 4096 tokens in fp32, and the demo's 24 of 256 tokens
# (at most 173) in one batch, as before the bound existed.
HF_BATCH_BYTES = 2 << 30
# Logit-sized fp32 rows one decoding step keeps per sequence (logits, warped copies, softmax,
# the recorded log-softmax), counted generously.
_LOGIT_BUFFERS = 8


def hf_max_num_seqs(model: str, dtype: str, max_model_len: int) -> int:
    """The default batch of the ``hf`` engine: as many sequences as fit in
    :data:`HF_BATCH_BYTES` at ``max_model_len`` tokens each (KV cache of every layer plus the
    logit buffers of a decoding step), at least 1. Read from the model's ``config.json``."""
    from transformers import AutoConfig

    from entrogym.agents.engines.vllm_local import model_kv_cache_bytes

    kv = model_kv_cache_bytes(
        model,
        engine_dtype(dtype),
        max_num_seqs=1,
        max_model_len=max_model_len,
        block_size=1,
    )
    config = AutoConfig.from_pretrained(model)
    vocab = (getattr(config, "text_config", None) or config).vocab_size
    return max(1, HF_BATCH_BYTES // (kv + _LOGIT_BUFFERS * 4 * vocab))


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
    same distribution, not ``generate``'s tokens under a seed)."""

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
        self._start()

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

    @torch.no_grad()
    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        from peft import PeftModel

        if self.decode != "generate":
            decoder = self._static_decoder(adapter)
            if decoder is not None:
                return self._generate_all(self._static_batch(decoder), prompts, params)
        model = self._select_adapter(adapter)
        # LoRA layers live inside the base modules: the base model needs them switched off.
        off = adapter is None and isinstance(model, PeftModel)
        with model.disable_adapter() if off else contextlib.nullcontext():
            return self._generate_all(
                lambda ids, ps: self._generate_batch(model, ids, ps), prompts, params
            )

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
        """Drop every merged copy of the weights (with its KV cache): one model's worth of
        memory per adapter version held. In a synchronous run the next rollouts sample a new
        version, so nothing is merged twice."""
        self._decoders.clear()

    def _drop_decoders(self, keep: int) -> None:
        """Keep the ``keep`` most recently used adapters' decoders (and the base's)."""
        adapters = [k for k in self._decoders if k is not None]
        for oldest in adapters[: max(0, len(adapters) - keep)]:
            del self._decoders[oldest]

    def _static_batch(self, decoder: StaticDecoder) -> Callable[..., list[Completion]]:
        def run(prompts: list[list[int]], params: list[SamplingParams]) -> list[Completion]:
            p = params[0]
            stops = [] if p.ignore_eos else sorted(set(self._eos) | set(p.stop_token_ids))
            if p.seed is not None:
                torch.manual_seed(p.seed)
            new, logprobs = decoder.sample(
                prompts,
                p,
                max(q.max_tokens for q in params),
                stops,
                self._pad,
                draw=STATIC_DRAWS[self.decode],
            )
            return _completions(new, logprobs, params, stops)

        return run

    def _generate_all(
        self,
        batch: Callable[[list[list[int]], list[SamplingParams]], list[Completion]],
        prompts: list[list[int]],
        params: list[SamplingParams],
    ) -> list[Completion]:
        size = self.max_num_seqs
        # One generate call per distinct set of sampling settings (max_tokens aside).
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
            done = batch([prompts[i] for i in group], [params[i] for i in group])
            results.update(zip(group, done, strict=True))
        return [results[i] for i in range(len(prompts))]

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
        return _completions(sequences[:, width:], recorder.finish(sequences), params, stops)


def _completions(
    new: torch.Tensor, logprobs: torch.Tensor, params: list[SamplingParams], stops: list[int]
) -> list[Completion]:
    """One completion per row of the generated ids ``new`` [B, steps] and their log-probs:
    cut at the row's ``max_tokens`` and after its first stop token (kept)."""
    new, logprobs = new.cpu(), logprobs.cpu()
    completions = []
    for row, q in enumerate(params):
        ids = new[row, : q.max_tokens].tolist()
        cut = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
        ids = ids[:cut] if cut is not None else ids
        lp = logprobs[row, : len(ids)].tolist()
        completions.append(Completion(ids, lp, "stop" if cut is not None else "length"))
    return completions


class SampledLogprobs:
    """A logits processor that changes nothing and records log_softmax(raw logits)[sampled id].

    ``generate`` calls it once per step with the raw logits (before temperature and top-k/p,
    which come after user processors) and the ids so far; the id sampled from step t's logits
    is the last id at step t + 1, so each call settles the previous step and ``finish`` the
    last. Only one step's log-softmax is kept at a time.
    """

    def __init__(self) -> None:
        self._pending: torch.Tensor | None = None  # the previous step's log-softmax [B, V]
        self._steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._settle(input_ids[:, -1:])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _settle(self, sampled: torch.Tensor) -> None:
        if self._pending is not None:
            self._steps.append(self._pending.gather(-1, sampled.to(self._pending.device))[:, 0])
            self._pending = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs of the generated ids (``sequences``: prompt + generated)."""
        self._settle(sequences[:, -1:])
        if not self._steps:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self._steps, dim=1)


def _settings(p: SamplingParams) -> tuple:
    return (p.temperature, p.top_p, p.top_k, p.stop_token_ids, p.seed, p.ignore_eos)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
