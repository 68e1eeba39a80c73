"""Fault injection for the ``vllm-server`` engine: servers that die, hang or are all gone.

A small stdlib HTTP server stands in for ``vllm serve`` (the OpenAI-compatible completions API
and the runtime LoRA endpoints) so each fault can be injected on 127.0.0.1 in milliseconds.
Every test bounds its wall time: the engine must not hang the run.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.base import vllm_max_lora_rank
from entrogym.agents.engines.vllm_server import ServersUnavailable
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.models import resolve_model

FAST = dict(request_timeout=0.5, max_retries=2, retry_backoff=0.05)


class _Handler(BaseHTTPRequestHandler):
    server: FakeVLLM

    def do_GET(self):  # noqa: N802
        self._send({"data": [{"id": "m", "max_model_len": 512}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            self.server.loads.append((self.path, body["lora_name"]))
            return self._send("Success")
        fake = self.server
        with fake.lock:
            fake.requests += 1
            dies = fake.die_after is not None and fake.requests > fake.die_after
        if fake.hang:  # accepts the request and never answers
            fake.release.wait(30)
            return
        if dies or fake.dead:  # drop the connection without an answer, as a killed process
            fake.kill()
            return
        with fake.lock:
            fake.answered += 1
        stop = body["stop_token_ids"][:1]
        ids = [42, 43, *stop] if stop else [42] * body["max_tokens"]
        logprobs = {"token_logprobs": [-1.0] * len(ids)}
        reason = "stop" if stop else "length"
        self._send({"choices": [{"token_ids": ids, "logprobs": logprobs, "finish_reason": reason}]})

    def _send(self, payload):
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class FakeVLLM(ThreadingHTTPServer):
    """A fake ``vllm serve`` of model "m": healthy, hanging (``hang``) or dying after
    ``die_after`` completions (it then refuses every connection, as a dead process)."""

    daemon_threads = True

    def __init__(self, *, hang: bool = False, die_after: int | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hang, self.die_after, self.dead = hang, die_after, False
        self.requests = self.answered = 0
        self.loads: list[tuple[str, str]] = []
        self.lock, self.release = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def kill(self) -> None:
        with self.lock:
            if self.dead:
                return
            self.dead = True
        # from another thread: shutdown() waits for serve_forever, which may be this caller's
        threading.Thread(target=self.stop, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()  # the port now refuses connections


@pytest.fixture
def servers():
    made: list[FakeVLLM] = []

    def make(**kwargs) -> FakeVLLM:
        made.append(FakeVLLM(**kwargs))
        return made[-1]

    yield make
    for s in made:
        if not s.dead:
            s.stop()


def lora_folder(path, rank: int) -> str:
    """An adapter folder as far as the server engine checks it (config and weights file)."""
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank}))
    save_file({"x": torch.zeros(1)}, str(path / "adapter_model.safetensors"))
    return str(path)


def test_server_that_dies_mid_rollout_fails_over(servers, tmp_path):
    dying, healthy = servers(die_after=3), servers()
    engine = make_engine(
        "vllm-server", "m", urls=[dying.url, healthy.url], max_model_len=512, **FAST
    )
    agent = LLMAgent(
        AutoTokenizer.from_pretrained(resolve_model("tiny-random-llama")),
        max_turn_tokens=8,
        max_context=512,
    )
    env = make_text_env("entrogym/Arithmetic-v0")
    tasks = task_ids_of(env, "train")[:4]
    env.close()
    adapter = lora_folder(tmp_path / "v1", 16)
    start = time.monotonic()
    eps = collect_rollouts(
        "entrogym/Arithmetic-v0", tasks, engine, agent, k=4, adapter=adapter, early_stop=False
    )
    assert time.monotonic() - start < 30
    assert len(eps) == 16 and all(e.num_action_tokens == 3 for e in eps)
    assert not any(e.info.get("error") for e in eps)
    assert dying.dead and dying.answered == 3 and healthy.answered == 13
    assert engine.failovers >= 1
    # loaded on failover (again if a slow answer under load made it count as failed once)
    loads = [path for path, _ in healthy.loads]
    assert loads and set(loads) == {"/v1/load_lora_adapter"}
    engine.close()


def test_hung_server_times_out_then_names_its_url(servers):
    hung = servers(hang=True)
    engine = make_engine("vllm-server", "m", urls=[hung.url], max_model_len=512, **FAST)
    start = time.monotonic()
    with pytest.raises(ServersUnavailable) as err:
        engine.generate([[1, 2, 3]] * 2, SamplingParams(max_tokens=4))
    elapsed = time.monotonic() - start
    # 3 rounds of at most request_timeout each, plus 0.05 + 0.1 s of backoff
    assert 1.5 <= elapsed < 5, elapsed
    assert hung.url in str(err.value) and "request_timeout" in str(err.value)
    assert hung.requests == 6  # 2 prompts x 3 rounds: bounded in count too
    engine.close()


def test_hung_server_beside_a_healthy_one_costs_one_timeout(servers):
    hung, healthy = servers(hang=True), servers()
    engine = make_engine(
        "vllm-server", "m", urls=[hung.url, healthy.url], max_model_len=512, **FAST
    )
    start = time.monotonic()
    out = engine.generate([[1, 2, 3]] * 6, SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 3
    assert all(c.token_ids == [42] * 4 and c.info["server"] == healthy.url for c in out)
    # the hung server is skipped once it has failed: later calls do not wait on it again
    start = time.monotonic()
    engine.generate([[1, 2, 3]] * 6, SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 0.45 and hung.requests == 3
    engine.close()


def test_all_servers_gone_names_every_url(servers):
    a, b = servers(), servers()
    engine = make_engine("vllm-server", "m", urls=[a.url, b.url], max_model_len=512, **FAST)
    a.stop()
    b.stop()
    start = time.monotonic()
    with pytest.raises(ServersUnavailable, match="all 2 vLLM server") as err:
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4))
    assert time.monotonic() - start < 3
    assert a.url in str(err.value) and b.url in str(err.value)
    engine.close()
    with pytest.raises(ConnectionError, match=f"unreachable.*{a.url}.*{b.url}.*urls"):
        make_engine("vllm-server", "m", urls=[a.url, b.url], max_model_len=512, **FAST)


def test_max_lora_rank_option_lets_a_rank_32_run_through(servers, tmp_path):
    server = servers()
    assert [vllm_max_lora_rank(r) for r in (8, 16, 24, 32, 33)] == [8, 16, 32, 32, 64]
    r32 = lora_folder(tmp_path / "r32", 32)
    narrow = make_engine("vllm-server", "m", urls=[server.url], max_model_len=512)
    with pytest.raises(ValueError, match="rank 32.*max_lora_rank=16.*--max-lora-rank"):
        narrow.generate([[1, 2]], SamplingParams(max_tokens=2), adapter=r32)
    wide = make_engine("vllm-server", "m", urls=[server.url], max_model_len=512, max_lora_rank=32)
    (c,) = wide.generate([[1, 2]], SamplingParams(max_tokens=2), adapter=r32)
    assert c.token_ids == [42, 42] and server.loads[-1][0] == "/v1/load_lora_adapter"
    for bad in (dict(request_timeout=0), dict(max_lora_rank=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            make_engine("vllm-server", "m", urls=[server.url], max_model_len=512, **bad)
    narrow.close()
    wide.close()
