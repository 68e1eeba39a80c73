"""vLLM-CPU start-up settings: the KV cache sized to the batch, the worker's core binding, and
that both reach vLLM (a recorder stands in for ``vllm.LLM``, so no vLLM starts here)."""

from __future__ import annotations

import dataclasses
import os
import sys
import types

import pytest
from tiny_llama import tiny_llama_config

from entrogym.agents.config import AgentConfig
from entrogym.agents.engines.vllm_engine import VLLMEngine
from entrogym.agents.engines.vllm_local import (
    GIB,
    cpu_bind,
    kv_cache_bytes,
    local_server_args,
    model_kv_cache_bytes,
    resolve_kv_cache_bytes,
    vllm_cpu_env,
)

ALLOWED = sorted(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The tests decide which vLLM variables are set, whatever the shell running them sets."""
    for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def tiny(tmp_path) -> str:
    """A config-only model folder: 2 layers, 4 heads of 8 dims, 2 KV heads."""
    tiny_llama_config(vocab_size=100).save_pretrained(tmp_path)
    return str(tmp_path)


def test_kv_bytes_by_hand():
    # 3 sequences of 130 tokens: 2 blocks of 128 each, 6 blocks, + vLLM's null block = 7.
    # A token: 2 layers x 1 KV head x 4 dims x 2 (K and V) x 2 bytes = 32 bytes.
    shape = dict(layers=2, kv_heads=1, head_dim=4, dtype_bytes=2, max_num_seqs=3)
    assert kv_cache_bytes(**shape, max_model_len=130, margin=0.0) == 7 * 128 * 32
    # 10 % margin: ceil(6 * 1.1) = 7 blocks, + 1 = 8.
    assert kv_cache_bytes(**shape, max_model_len=130) == 8 * 128 * 32
    # One block more per sequence once a sequence no longer fits two.
    assert kv_cache_bytes(**shape, max_model_len=257, margin=0.0) == 10 * 128 * 32
    assert kv_cache_bytes(**shape, max_model_len=16, block_size=16, margin=0.0) == 4 * 16 * 32


@pytest.mark.parametrize("name", ["layers", "max_num_seqs", "max_model_len", "block_size"])
def test_kv_bytes_bad_input_names_the_argument(name):
    shape = dict(layers=2, kv_heads=1, head_dim=4, dtype_bytes=2, max_num_seqs=3, max_model_len=8)
    with pytest.raises(ValueError, match=name):
        kv_cache_bytes(**{**shape, name: 0})


def test_kv_bytes_read_from_the_model_config(tiny):
    # A token: 2 layers x 2 KV heads x (32 / 4) dims x 2 x 4 bytes (fp32) = 256 bytes.
    got = model_kv_cache_bytes(tiny, "float32", max_num_seqs=4, max_model_len=256)
    assert got == 10 * 128 * 256  # 4 x 2 blocks, ceil(8 * 1.1) = 9, + the null block
    assert model_kv_cache_bytes(tiny, "bfloat16", max_num_seqs=4, max_model_len=256) == got // 2
    with pytest.raises(ValueError, match="dtype"):
        model_kv_cache_bytes(tiny, "int8", max_num_seqs=4, max_model_len=256)


def test_kv_bytes_explicit_size_then_env_then_model(tiny, monkeypatch):
    common = dict(max_num_seqs=4, max_model_len=256)
    assert resolve_kv_cache_bytes(tiny, "float32", kv_cache_gb=0.25, **common) == GIB // 4
    sized = resolve_kv_cache_bytes(tiny, "float32", kv_cache_gb=None, **common)
    assert sized == model_kv_cache_bytes(tiny, "float32", **common)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")  # the user's: vLLM reads it itself
    assert resolve_kv_cache_bytes(tiny, "float32", kv_cache_gb=None, **common) is None
    assert resolve_kv_cache_bytes(tiny, "float32", kv_cache_gb=0.5, **common) == GIB // 2
    with pytest.raises(ValueError, match="kv_cache_gb"):
        resolve_kv_cache_bytes(tiny, "float32", kv_cache_gb=0, **common)


def test_kv_bytes_capped_by_free_memory(tiny, monkeypatch):
    import psutil

    # Fault injection: a machine with 1 MiB free; the cache takes at most half of it.
    free = types.SimpleNamespace(available=1 << 20)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    got = resolve_kv_cache_bytes(
        tiny, "float32", kv_cache_gb=None, max_num_seqs=64, max_model_len=4096
    )
    assert got == 1 << 19


def test_binding_uses_the_threads_asked():
    assert cpu_bind(len(ALLOWED)) == ",".join(map(str, ALLOWED))
    assert cpu_bind(1) == str(ALLOWED[0])
    for bad in (0, len(ALLOWED) + 1, True, 1.5, None):
        with pytest.raises(ValueError, match="threads"):
            cpu_bind(bad)


def test_binding_the_user_set_is_kept(monkeypatch):
    # MKL_NUM_THREADS is always unset (None): this process's own cap must not reach vLLM's
    # worker, whose threads its binding decides
    unset_mkl = {"MKL_NUM_THREADS": None}
    assert vllm_cpu_env(1, kv_cache_gb=None) == {
        "VLLM_CPU_OMP_THREADS_BIND": str(ALLOWED[0]),
        **unset_mkl,
    }
    assert vllm_cpu_env(None, kv_cache_gb=None) == unset_mkl  # vLLM's own "auto"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert vllm_cpu_env(1, kv_cache_gb=None) == unset_mkl
    with pytest.raises(ValueError, match="threads"):
        vllm_cpu_env(len(ALLOWED) + 1, kv_cache_gb=None)
    # An explicit size must beat the legacy variable, which vLLM would put above the bytes.
    assert vllm_cpu_env(None, kv_cache_gb=1.0) == {"VLLM_CPU_KVCACHE_SPACE": None, **unset_mkl}


class RecordingLLM:
    """Stands in for ``vllm.LLM``: records its arguments and the environment it starts in."""

    calls: list[tuple[dict, dict]] = []

    def __init__(self, **kwargs) -> None:
        RecordingLLM.calls.append((kwargs, dict(os.environ)))


@pytest.fixture
def recorder(monkeypatch):
    RecordingLLM.calls = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=RecordingLLM))
    return RecordingLLM.calls


def test_engine_hands_kv_bytes_batch_and_binding_to_vllm(tiny, recorder):
    engine = VLLMEngine(tiny, dtype="fp32", max_model_len=256, max_num_seqs=4, threads=1)
    VLLMEngine(tiny, dtype="fp32", max_model_len=256, threads=len(ALLOWED)).close()
    VLLMEngine(tiny, dtype="fp32", max_model_len=256).close()
    (kwargs, env), (_, all_env), (_, auto_env) = recorder
    assert kwargs["kv_cache_memory_bytes"] == model_kv_cache_bytes(
        tiny, "float32", max_num_seqs=4, max_model_len=256
    )
    assert kwargs["max_num_seqs"] == 4
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(ALLOWED[0])
    assert all_env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, ALLOWED))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in auto_env  # threads None: vLLM's "auto"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    # vLLM's processes inherit the binding; this process's environment is as it was.
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    engine.close()


def test_engine_keeps_the_users_variables(tiny, recorder, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    VLLMEngine(tiny, dtype="fp32", max_model_len=256).close()
    VLLMEngine(tiny, dtype="fp32", max_model_len=256, kv_cache_gb=0.5).close()
    (plain, plain_env), (sized, sized_env) = recorder
    assert "kv_cache_memory_bytes" not in plain and plain_env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "max_num_seqs" not in plain  # unknown batch: vLLM's own limit
    assert sized["kv_cache_memory_bytes"] == GIB // 2 and "VLLM_CPU_KVCACHE_SPACE" not in sized_env
    assert (
        plain_env["VLLM_CPU_OMP_THREADS_BIND"] == sized_env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    )
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_engine_rejects_bad_batch_and_threads_before_starting(tiny, recorder):
    with pytest.raises(ValueError, match="max_num_seqs"):
        VLLMEngine(tiny, dtype="fp32", max_model_len=256, max_num_seqs=0)
    with pytest.raises(ValueError, match="max_loras must be a positive integer"):
        VLLMEngine(tiny, dtype="fp32", max_model_len=256, max_loras=0)  # checked by every engine
    with pytest.raises(ValueError, match="threads"):
        VLLMEngine(tiny, dtype="fp32", max_model_len=256, threads=len(ALLOWED) + 1)
    assert recorder == []


def test_local_server_gets_the_same_sizing(tiny):
    args = ["--dtype", "float32", "--max-model-len", "256"]
    got = local_server_args(tiny, args, 4, None, [])
    want = model_kv_cache_bytes(tiny, "float32", max_num_seqs=4, max_model_len=256)
    assert got == [
        "--max-num-seqs", "4", "--kv-cache-memory-bytes", str(want), "--enable-prefix-caching"
    ]  # fmt: skip
    mine = ["--max-num-seqs", "2", "--kv-cache-memory-bytes", "123", "--no-enable-prefix-caching"]
    assert local_server_args(tiny, args, 4, None, mine) == []  # server_args win


def test_engine_kwargs_pass_batch_and_threads_to_vllm_engines_only():
    vllm = AgentConfig(engine="vllm").engine_kwargs(max_num_seqs=24, threads=1)
    assert vllm["max_num_seqs"] == 24 and vllm["threads"] == 1
    hf = dataclasses.replace(AgentConfig(engine="vllm"), engine="hf")
    assert "max_num_seqs" not in hf.engine_kwargs(max_num_seqs=24, threads=1)
    assert "threads" not in AgentConfig(engine="vllm").engine_kwargs()
