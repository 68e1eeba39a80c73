"""In-process vLLM engine: log-probs, LoRA hot-swap, token-exact rollouts, bad input, restart.

One engine (tiny random Llama, fp32) serves the whole module: vLLM takes a minute to start on
2 cores.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from peft import LoraConfig, get_peft_model
from tiny_llama import tiny_llama_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.vllm_local import model_kv_cache_bytes
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import TextEnv, Turn
from entrogym.models import resolve_model
from entrogym.train.learner.logprobs import sequence_logprobs
from entrogym.train.learner.mismatch import ENTROPY_GAP_MAX_Z, engine_entropy_gap, sampler_mismatch

pytestmark = pytest.mark.slow
MODEL = "tiny-random-llama"
CORES = len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def path() -> str:
    return resolve_model(MODEL)


@pytest.fixture(scope="module")
def tokenizer(path):
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def engine(path):
    # The KV cache sized for 8 sequences, the worker bound to every core this process may use,
    # started as in a process that applied one thread to itself first (``apply_threads(1)``
    # sets these): the worker must still use every bound core.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        patch.setenv("MKL_NUM_THREADS", "1")
        eng = make_engine(
            "vllm", path, dtype="fp32", max_model_len=512, max_num_seqs=8, threads=CORES, seed=0
        )
    yield eng
    eng.close()


def bias_adapter(path: str, token: int, out, seed: int = 0, r: int = 8) -> str:
    """Train a LoRA that makes ``token`` the argmax everywhere (the tiny model's tied
    embeddings cap its probability, so the tests sample greedily)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = get_peft_model(
        model,
        LoraConfig(
            r=r, lora_alpha=2 * r, target_modules=["o_proj", "down_proj"], task_type="CAUSAL_LM"
        ),
    )
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    for _ in range(20):
        x = torch.randint(100, 40000, (4, 16))
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.full((x.numel(),), token)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(out))
    return str(out)


def trainer_logprobs(
    model, prompts, completions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, T] trainer log-probs, sampler log-probs and mask of the completions."""
    rows = [p + c.token_ids for p, c in zip(prompts, completions, strict=True)]
    t = max(map(len, rows))
    ids = torch.zeros((len(rows), t), dtype=torch.long)
    att, mask, samp = (
        torch.zeros_like(ids),
        torch.zeros((len(rows), t)),
        torch.zeros((len(rows), t)),
    )
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(rows[i])] = torch.tensor(rows[i])
        att[i, : len(rows[i])] = 1
        mask[i, len(p) : len(rows[i])] = 1
        samp[i, len(p) : len(rows[i])] = torch.tensor(c.logprobs)
    with torch.no_grad():
        return sequence_logprobs(model, ids, att), samp, mask


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    agent = LLMAgent(tokenizer, max_context=512)
    return [agent.start(f"Question {i}: what is {i} + {i}?").token_ids for i in range(n)]


def test_sampled_logprobs_match_the_trainer(engine, path, tokenizer):
    prompts = chat_prompts(tokenizer, 4)
    out = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=1.0))
    assert all(1 <= len(c.token_ids) <= 12 and c.finish_reason in ("stop", "length") for c in out)
    assert len({tuple(c.token_ids) for c in out}) > 1  # sampling, not a constant
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    m = sampler_mismatch(*trainer_logprobs(model, prompts, out))
    assert m["num_tokens"] == sum(len(c.token_ids) for c in out)
    assert m["mean_abs_diff"] < 1e-4 and m["max_abs_diff"] < 1e-3 and m["frac_ratio_outside"] == 0


def test_lora_hot_swap_follows_the_latest_adapter(engine, path, tokenizer, tmp_path):
    yes = tokenizer(" yes", add_special_tokens=False)["input_ids"][0]
    no = tokenizer(" no", add_special_tokens=False)["input_ids"][0]
    a_yes = bias_adapter(path, yes, tmp_path / "v1")
    a_no = bias_adapter(path, no, tmp_path / "v2", seed=1)
    prompts = chat_prompts(tokenizer, 3)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)

    def share(adapter, token):
        out = engine.generate(prompts, greedy, adapter=adapter)
        ids = [t for c in out for t in c.token_ids]
        return sum(t == token for t in ids) / len(ids), out

    assert share(None, yes)[0] < 0.5
    frac, out = share(a_yes, yes)
    assert frac == 1.0
    # vLLM applies the adapter exactly as peft does.
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(base, a_yes).eval()
    m = sampler_mismatch(*trainer_logprobs(peft_model, prompts, out))
    assert m["mean_abs_diff"] < 1e-4, m
    assert share(a_no, no)[0] == 1.0  # a new policy version, a new folder
    # A trainer that rewrites the same folder: the engine must load the new weights.
    time.sleep(0.01)
    shutil.copy(
        os.path.join(a_no, "adapter_model.safetensors"),
        os.path.join(a_yes, "adapter_model.safetensors"),
    )
    assert share(a_yes, no)[0] == 1.0


def test_rollouts_are_token_exact(engine, tokenizer):
    class Chat(TextEnv):
        splits = ("train",)

        def __init__(self):
            super().__init__(max_turns=3)

        def task_ids(self, split=None):
            return ["a", "b"]

        def _start_task(self, task_id):
            return f"Task {task_id}.", {}

        def _respond(self, action):
            return Turn(f"Got {len(action)} chars.", done=self._turn + 1 >= 3, reward=0.5)

    calls = []

    class Recorder:
        max_model_len = engine.max_model_len

        def generate(self, prompts, params, adapter=None):
            out = engine.generate(prompts, params, adapter)
            calls.extend((tuple(p), c) for p, c in zip(prompts, out, strict=True))
            return out

    agent = LLMAgent(tokenizer, max_turn_tokens=6, max_context=512, on_turn_budget="step")
    episodes = collect_rollouts(Chat, ["a", "b"], Recorder(), agent, k=3, chunk_tokens=4)
    assert len(episodes) == 6 and {e.group_id for e in episodes} == {0, 1}
    served = {}
    for prompt, c in calls:
        served.setdefault(prompt, []).append(c)
    for ep in episodes:
        ids, mask, pos = ep.token_ids, ep.action_mask, ep.info["prompt_tokens"]
        assert ep.num_turns == 3 and ep.reward == 0.5
        assert mask[:pos] == [0] * pos
        for turn, action in enumerate(ep.info["actions"]):
            start = pos
            while True:  # the turn's chunks, each one engine completion for exactly this prefix
                c = next(
                    c
                    for c in served[tuple(ids[:pos])]
                    if c.token_ids == ids[pos : pos + len(c.token_ids)]
                )
                assert mask[pos : pos + len(c.token_ids)] == [1] * len(c.token_ids)
                assert ep.sampler_logprobs[pos : pos + len(c.token_ids)] == c.logprobs
                pos += len(c.token_ids)
                if pos - start >= 6 or c.token_ids[-1] == agent.eot_ids[0]:
                    break
            assert tokenizer.decode(ids[start:pos], skip_special_tokens=True) == action
            if turn == 2:
                assert pos == len(ids)
                break
            close = "\n" if ids[pos - 1] == agent.eot_ids[0] else "<|im_end|>\n"
            fb = f"{close}<|im_start|>user\nGot {len(action)} chars.<|im_end|>\n<|im_start|>assistant\n"
            n = len(tokenizer(fb, add_special_tokens=False)["input_ids"])
            assert tokenizer.decode(ids[pos : pos + n]) == fb and mask[pos : pos + n] == [0] * n
            pos += n


def test_bad_adapters_are_rejected(engine, path, tmp_path):
    other = tiny_llama_config(vocab_size=49152, hidden_size=64, intermediate_size=128,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # fmt: skip
    model = get_peft_model(
        AutoModelForCausalLM.from_config(other),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model.save_pretrained(str(tmp_path / "other"))
    prompt = [[1, 2, 3]]
    with pytest.raises(ValueError, match="does not match base model"):
        engine.generate(prompt, SamplingParams(max_tokens=2), adapter=tmp_path / "other")
    wide = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path),
        LoraConfig(r=32, target_modules=["q_proj"], task_type="CAUSAL_LM"),
    )
    wide.save_pretrained(str(tmp_path / "wide"))
    with pytest.raises(ValueError, match="max_lora_rank"):
        engine.generate(prompt, SamplingParams(max_tokens=2), adapter=tmp_path / "wide")
    with pytest.raises(ValueError, match="adapter_config.json"):
        engine.generate(prompt, SamplingParams(max_tokens=2), adapter=tmp_path)


def test_prompt_longer_than_the_context(engine):
    with pytest.raises(ValueError, match="max_model_len=512"):
        engine.generate([[5] * 600], SamplingParams(max_tokens=2))
    out = engine.generate([[5] * 500], SamplingParams(max_tokens=50))
    assert len(out[0].token_ids) <= 12  # max_tokens lowered to what fits


def test_sampler_draws_from_the_full_distribution(engine, path):
    """At temperature 1 with no top-k/top-p the sampled -log pi matches the exact entropy;
    an injected top-50 sampler fails the same check (1280 tokens each)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [1, 504, 3158, 314, 253, 1345, 28]
    exact = engine_entropy_gap(engine, model, prompt, SamplingParams(max_tokens=32), samples=40)
    assert exact["num_tokens"] >= 1000 and abs(exact["z"]) < ENTROPY_GAP_MAX_Z, exact
    top50 = SamplingParams(max_tokens=32, top_k=50)
    truncated = engine_entropy_gap(engine, model, prompt, top50, samples=40)
    assert truncated["num_tokens"] >= 1000 and truncated["z"] < -ENTROPY_GAP_MAX_Z, truncated


def test_kv_cache_and_binding_reach_vllm(engine, path, tokenizer):
    """vLLM got the sized KV cache (not VLLM_CPU_KVCACHE_SPACE's whole GiB), and the worker's
    OpenMP threads sit one on each core (vLLM's "auto" would leave one core to its scheduler)."""
    cache = engine._llm.llm_engine.vllm_config.cache_config
    want = model_kv_cache_bytes(path, "float32", max_num_seqs=8, max_model_len=512)
    assert cache.kv_cache_memory_bytes == engine.kv_cache_bytes == want
    engine.generate(chat_prompts(tokenizer, 4), SamplingParams(max_tokens=8))
    workers = [w for pid in engine.engine_pids() for w in psutil.Process(pid).children()]
    pinned = set()
    for worker in workers:
        for task in Path(f"/proc/{worker.pid}/task").iterdir():
            status = (task / "status").read_text()
            cpus = status.split("Cpus_allowed_list:")[1].split()[0]
            if cpus.isdigit():  # a thread bound to one CPU: an OpenMP thread
                pinned.add(int(cpus))
    assert pinned == set(sorted(os.sched_getaffinity(0))[:CORES]), pinned


def test_engine_restarts_once_after_a_crash(engine, tokenizer):
    pids = engine.engine_pids()
    assert pids, "could not find vLLM's engine-core process"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    out = engine.generate(chat_prompts(tokenizer, 2), SamplingParams(max_tokens=4))
    assert engine.restarts == 1 and all(c.token_ids for c in out)
