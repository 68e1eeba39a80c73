"""In-process vLLM (``vllm.LLM``) with LoRA hot-swap.

Each policy version's adapter folder becomes a new ``LoRARequest`` (a fresh integer id per
folder and file modification time), so a rollout always samples from the latest weights even
when a trainer rewrites the same folder. vLLM starts worker processes: scripts that make this
engine need the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

from entrogym.agents.engines.base import (
    Completion,
    Engine,
    EngineDied,
    SamplingParams,
    check_lora_rank,
    engine_dtype,
    vllm_max_lora_rank,
)
from entrogym.agents.engines.vllm_local import (
    CPU_BLOCK_SIZE,
    resolve_kv_cache_bytes,
    scoped_env,
    vllm_cpu_env,
)

log = logging.getLogger(__name__)


def adapter_key(path: str) -> tuple[str, int]:
    """(folder, mtime of its weights): a rewritten folder counts as a new adapter."""
    return path, (Path(path) / "adapter_model.safetensors").stat().st_mtime_ns


class VLLMEngine(Engine):
    """``vllm.LLM(model, enable_lora=True, ...)`` behind :class:`Engine`.

    Args:
        model: a Hugging Face folder (see ``entrogym.models.resolve_model``) or hub id.
        dtype: ``bf16``, ``fp32``, ``fp16`` or ``auto``.
        max_model_len: context length (prompt + completion) the engine accepts.
        seed: vLLM's global sampling seed.
        max_lora_rank: the largest adapter rank the engine accepts (pass the run's LoRA rank;
            rounded up to a rank vLLM supports, e.g. 24 -> 32).
        max_num_seqs: sequences vLLM runs at once: pass the rollout batch (tasks x K). The KV
            cache is sized for this many sequences of ``max_model_len`` tokens. None: vLLM's
            own limit, and a KV cache for ``DEFAULT_KV_SEQS`` (8) full-length sequences.
        kv_cache_gb: KV cache size (GiB, fractions allowed) instead of the sized one. None
            with ``VLLM_CPU_KVCACHE_SPACE`` set: that variable's whole GiB, as vLLM reads it.
        threads: CPU cores vLLM-CPU's worker runs on (``VLLM_CPU_OMP_THREADS_BIND`` is set to
            the first ``threads`` CPUs this process may use); None keeps vLLM's ``auto``
            binding (see ``vllm_local.vllm_cpu_env``). A ``VLLM_CPU_OMP_THREADS_BIND`` set in
            the environment is kept.
        enforce_eager: skip ``torch.compile``; on a 2-core CPU compiling costs a minute of
            start-up for little gain on small models.
        llm_kwargs: passed to ``vllm.LLM`` as is (e.g. ``gpu_memory_utilization``).
    """

    kind = "vllm"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "bf16",
        max_model_len: int = 4096,
        seed: int = 0,
        max_lora_rank: int = 16,
        max_loras: int = 1,
        max_num_seqs: int | None = None,
        kv_cache_gb: float | None = None,
        threads: int | None = None,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        super().__init__(model, max_model_len, seed, max_loras, max_num_seqs)
        self.dtype = engine_dtype(dtype)
        self.max_lora_rank = vllm_max_lora_rank(max_lora_rank)
        self.kv_cache_gb = kv_cache_gb
        self.threads = threads
        # Checked now, so a bad value fails before any process starts.
        self.env = vllm_cpu_env(threads, kv_cache_gb=kv_cache_gb)
        self.kv_cache_bytes = resolve_kv_cache_bytes(
            model,
            self.dtype,
            kv_cache_gb=kv_cache_gb,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            block_size=llm_kwargs.get("block_size") or CPU_BLOCK_SIZE,
        )
        self.enforce_eager = enforce_eager
        self.enable_prefix_caching = enable_prefix_caching
        self.llm_kwargs = llm_kwargs
        self._llm: Any = None
        self._lora_ids: dict[tuple[str, int], int] = {}
        self._start()

    @property
    def reuses_prefixes(self) -> bool:  # type: ignore[override]
        """vLLM's automatic prefix caching: a prompt that extends an earlier one (the next turn
        of a conversation) prefills only the blocks it adds."""
        return self.enable_prefix_caching

    def _start(self) -> None:
        from vllm import LLM

        self._lora_ids.clear()
        # Default sampling settings never come from the checkpoint's generation_config.
        llm_kwargs = {"generation_config": "vllm", **self.llm_kwargs}
        if self.max_num_seqs is not None:
            llm_kwargs.setdefault("max_num_seqs", self.max_num_seqs)
        if self.kv_cache_bytes is not None:
            llm_kwargs.setdefault("kv_cache_memory_bytes", self.kv_cache_bytes)
        # vLLM's processes inherit the binding; this process's environment is left as it was.
        with scoped_env(self.env):
            self._llm = LLM(
                model=self.model,
                dtype=self.dtype,
                max_model_len=self.max_model_len,
                seed=self.seed,
                enable_lora=True,
                max_lora_rank=self.max_lora_rank,
                max_loras=self.max_loras,
                enforce_eager=self.enforce_eager,
                enable_prefix_caching=self.enable_prefix_caching,
                **llm_kwargs,
            )

    def _shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()

    def engine_pids(self) -> list[int]:
        """Process ids of vLLM's engine-core processes (to watch them, or to test a crash)."""
        core = getattr(getattr(self._llm, "llm_engine", None), "engine_core", None)
        manager = getattr(getattr(core, "resources", None), "engine_manager", None)
        procs = getattr(manager, "processes", None) or []
        return [p.pid for p in procs if getattr(p, "pid", None)]

    def check_adapter(self, adapter: str | os.PathLike) -> str:
        path = super().check_adapter(adapter)
        check_lora_rank(path, self.max_lora_rank, "the vllm engine")
        return path

    def lora_request(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        key = adapter_key(adapter)
        if key not in self._lora_ids:
            self._lora_ids[key] = len(self._lora_ids) + 1
        lora_id = self._lora_ids[key]
        return LoRARequest(lora_name=f"adapter-{lora_id}", lora_int_id=lora_id, lora_path=adapter)

    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._llm is None:
            raise EngineDied("the engine is not running")
        vparams = [
            VSamplingParams(
                n=1,
                max_tokens=p.max_tokens,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                # Stated, not left to defaults: at temperature 1 the sampler draws from the
                # full distribution (no min-p, no penalties), i.e. from the policy itself.
                min_p=0.0,
                repetition_penalty=1.0,
                presence_penalty=0.0,
                frequency_penalty=0.0,
                seed=p.seed,
                stop_token_ids=[] if p.ignore_eos else list(p.stop_token_ids),
                ignore_eos=p.ignore_eos,
                logprobs=0,  # the sampled token's log-prob only
                detokenize=False,
                skip_special_tokens=False,
            )
            for p in params
        ]
        try:
            outputs = self._llm.generate(
                [{"prompt_token_ids": ids} for ids in prompts],
                vparams,
                lora_request=self.lora_request(adapter),
                use_tqdm=False,
            )
        except EngineDeadError as e:
            raise EngineDied(str(e)) from e
        return [_completion(out.outputs[0]) for out in outputs]


def _completion(out: Any) -> Completion:
    ids = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(ids):
        raise RuntimeError("vLLM returned no log-prob for some sampled tokens (logprobs=0 unset?)")
    logprobs = [float(step[tid].logprob) for tid, step in zip(ids, out.logprobs, strict=True)]
    reason = (
        out.finish_reason if out.finish_reason in ("stop", "length") else str(out.finish_reason)
    )
    return Completion(ids, logprobs, reason, {"stop_reason": out.stop_reason})
