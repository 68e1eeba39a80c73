"""``vllm-server`` engine against a real local ``vllm serve`` of the tiny random Llama, plus
unreachable and malformed servers (a small stdlib HTTP server injects those faults)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import entrogym  # noqa: F401
from entrogym.agents.agent import LLMAgent
from entrogym.agents.engines import SamplingParams, make_engine
from entrogym.agents.engines.vllm_server import ServerError, VLLMServerEngine
from entrogym.agents.rollout import collect_rollouts
from entrogym.envs.base import make_text_env, task_ids_of
from entrogym.localserver import free_port
from entrogym.models import resolve_model
from entrogym.train.learner.mismatch import ENTROPY_GAP_MAX_Z, engine_entropy_gap, episodes_mismatch

MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def path() -> str:
    return resolve_model(MODEL)


@pytest.fixture(scope="module")
def server(path):
    eng = make_engine("vllm-server", path, dtype="fp32", max_model_len=512, kv_cache_gb=1)
    yield eng
    eng.close()
    assert eng.server is not None and not eng.server.alive()


@pytest.fixture(scope="module")
def adapter(path, tmp_path_factory) -> str:
    """A random (non-zero) LoRA: it moves every log-prob, so a wrong adapter shows."""
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(
            r=8,
            lora_alpha=64,
            target_modules=["q_proj", "v_proj", "down_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    )
    out = tmp_path_factory.mktemp("adapter") / "v1"
    model.save_pretrained(str(out))
    return str(out)


@pytest.mark.slow
def test_rollouts_through_the_server_match_the_trainer(server, path, adapter):
    assert server.server.url.startswith("http://127.0.0.1:")
    env = make_text_env("entrogym/Arithmetic-v0")
    tasks = task_ids_of(env, "train")[:2]
    env.close()
    agent = LLMAgent(AutoTokenizer.from_pretrained(path), max_turn_tokens=8, max_context=512)
    base_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eps = collect_rollouts("entrogym/Arithmetic-v0", tasks, server, agent, k=3)
    assert len(eps) == 6 and all(e.num_action_tokens >= 1 for e in eps)
    assert episodes_mismatch(base_model, eps)["max_abs_diff"] < 1e-3
    # The adapter is loaded at run time; the server's log-probs are then the adapted model's.
    eps = collect_rollouts("entrogym/Arithmetic-v0", tasks, server, agent, k=3, adapter=adapter)
    assert len(eps) == 6
    peft_model = PeftModel.from_pretrained(base_model, adapter).eval()
    with_adapter = episodes_mismatch(peft_model, eps)
    assert with_adapter["mean_abs_diff"] < 1e-4, with_adapter
    with peft_model.disable_adapter():
        assert (
            episodes_mismatch(peft_model, eps)["mean_abs_diff"]
            > 100 * with_adapter["mean_abs_diff"]
        )


@pytest.mark.slow
def test_requests_spread_over_several_urls(server, path):
    url = server.server.url
    remote = VLLMServerEngine(path, urls=[url, url + "/"], max_model_len=512)
    out = remote.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=3, temperature=0.0))
    assert len(remote.urls) == 2 and all(len(c.token_ids) == 3 for c in out)
    assert len({tuple(c.token_ids) for c in out}) == 1  # greedy: the same on every server
    remote.close()
    assert server.server.alive()  # closing a client of external servers leaves them running
    with pytest.raises(ValueError, match="serves"):
        VLLMServerEngine("another-model", urls=[url], max_model_len=512)
    with pytest.raises(ValueError, match="max_model_len"):
        VLLMServerEngine(path, urls=[url], max_model_len=4096)


@pytest.mark.slow
def test_server_samples_the_full_distribution(server, path):
    """As for the in-process engine: exact at temperature 1, and top-50 is caught."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [1, 504, 3158, 314, 253, 1345, 28]
    exact = engine_entropy_gap(server, model, prompt, SamplingParams(max_tokens=32), samples=40)
    assert exact["num_tokens"] >= 1000 and abs(exact["z"]) < ENTROPY_GAP_MAX_Z, exact
    top50 = SamplingParams(max_tokens=32, top_k=50)
    truncated = engine_entropy_gap(server, model, prompt, top50, samples=40)
    assert truncated["num_tokens"] >= 1000 and truncated["z"] < -ENTROPY_GAP_MAX_Z, truncated


@pytest.mark.slow
def test_local_server_that_dies_is_restarted(server):
    old = server.server.proc.pid
    server.server.stop()  # the server is gone, as after an OOM kill
    out = server.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert server.restarts == 1 and server.server.proc.pid != old and len(out[0].token_ids) == 2


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(ConnectionError, match="unreachable.*urls"):
        VLLMServerEngine("m", urls=[f"http://127.0.0.1:{free_port()}"], max_model_len=64)


class _Fake(BaseHTTPRequestHandler):
    """Answers /v1/models properly and /v1/completions with ``self.server.body``."""

    def do_GET(self):  # noqa: N802
        self._send(json.dumps({"data": [{"id": "m", "max_model_len": 64}]}))

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(self.server.body)

    def _send(self, body: str):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "body",
    [
        "<html>not json",
        json.dumps({"choices": []}),
        json.dumps({"choices": [{"token_ids": [1, 2], "finish_reason": "stop"}]}),
        json.dumps(
            {
                "choices": [
                    {
                        "token_ids": [1, 2],
                        "logprobs": {"token_logprobs": [-1.0]},
                        "finish_reason": "length",
                    }
                ]
            }
        ),
    ],
)
def test_malformed_answers_are_clear_errors(body):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    httpd.body = body
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        eng = VLLMServerEngine(
            "m", urls=[f"http://127.0.0.1:{httpd.server_port}"], max_model_len=64
        )
        with pytest.raises(ServerError, match="malformed JSON|log-probs"):
            eng.generate([[1, 2]], SamplingParams(max_tokens=2))
        eng.close()
    finally:
        httpd.shutdown()


def test_well_formed_answer_is_parsed():
    body = {
        "choices": [
            {
                "token_ids": [7, 2],
                "logprobs": {
                    "token_logprobs": [-0.5, -0.25],
                    "tokens": ["token_id:7", "token_id:2"],
                },
                "finish_reason": "stop",
            }
        ]
    }
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    httpd.body = json.dumps(body)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        eng = VLLMServerEngine(
            "m", urls=[f"http://127.0.0.1:{httpd.server_port}"], max_model_len=64
        )
        (c,) = eng.generate([[1, 2]], SamplingParams(max_tokens=2))
        assert (c.token_ids, c.logprobs, c.finish_reason) == ([7, 2], [-0.5, -0.25], "stop")
        eng.close()
    finally:
        httpd.shutdown()
