"""Plain-HTTP client of AppWorld's environment server (no ``appworld`` import here).

Endpoints and bodies are those of ``appworld.serve.environment``: ``/initialize``,
``/execute``, ``/task_completed``, ``/evaluate``, ``/close``; every answer is
``{"output": ...}``.
"""

from __future__ import annotations

from typing import Any

import requests


class ServerDied(RuntimeError):
    """The server did not answer (connection refused, reset, or read timeout)."""


class ServerError(RuntimeError):
    """The server answered with an error status."""


class AppWorldClient:
    def __init__(self, url: str, request_timeout_s: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.session = requests.Session()

    def _post(self, method: str, timeout_s: float | None = None, **body: Any) -> Any:
        try:
            response = self.session.post(
                f"{self.url}/{method}", json=body, timeout=timeout_s or self.request_timeout_s
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ServerDied(
                f"AppWorld server at {self.url} did not answer /{method}: {exc}"
            ) from exc
        if response.status_code != 200:
            raise ServerError(
                f"AppWorld /{method} failed ({response.status_code}): {response.text[:2000]}"
            )
        return response.json()["output"]

    def initialize(
        self, task_id: str, experiment_name: str, timeout_seconds: int, **kwargs: Any
    ) -> dict:
        """Load the task's world; returns its instruction, supervisor and datetime."""
        return self._post(
            "initialize",
            timeout_s=max(self.request_timeout_s, 120.0),
            task_id=task_id,
            experiment_name=experiment_name,
            timeout_seconds=timeout_seconds,
            **kwargs,
        )

    def execute(self, task_id: str, code: str, timeout_s: float | None = None) -> str:
        return self._post("execute", timeout_s=timeout_s, task_id=task_id, code=code)

    def task_completed(self, task_id: str) -> bool:
        return bool(self._post("task_completed", task_id=task_id))

    def evaluate(self, task_id: str, report: bool = False) -> Any:
        """AppWorld's TestTracker as a dict (passes, failures, success, num_tests), or its report text."""
        return self._post("evaluate", task_id=task_id, suppress_errors=True, report=report)

    def close(self, task_id: str) -> None:
        self._post("close", task_id=task_id)
