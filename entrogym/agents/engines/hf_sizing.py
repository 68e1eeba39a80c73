"""How much the ``hf`` engine holds at once: the sequences of one ``generate`` batch
(:func:`hf_max_num_seqs`) and the caches kept between calls (:data:`KEPT_CACHE_BYTES`)."""

from __future__ import annotations

from entrogym.agents.engines.base import engine_dtype

# What one ``generate`` batch may hold at full context: its KV cache plus its logit buffers.
# 2 GiB fits 11 SmolLM2-135M sequences of 4096 tokens in fp32, and the demo's 24 of 256 tokens
# (at most 173) in one batch, as before the bound existed.
HF_BATCH_BYTES = 2 << 30
# Logit-sized fp32 rows one decoding step keeps per sequence (logits, warped copies, softmax,
# the recorded log-softmax), counted generously.
_LOGIT_BUFFERS = 8
# What the static decoder's caches kept between calls (``cache_keys``) may hold: two batches'
# worth, so that a rollout of up to two batches keeps every conversation's cache.
KEPT_CACHE_BYTES = 2 * HF_BATCH_BYTES


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
