"""The model client: one chat-completions request over httpx, errors translated here.

It knows the wire format of OpenAI-compatible servers and nothing about scripts.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from workers.cancel import CancelToken
from workers.errors import Cancelled, ProviderError
from workers.settings import HarnessSettings
from workers.state import Message
from workers.usage import Usage

RETRYABLE = {429, 503}
KEEPALIVE_S = 2.0
MAX_RETRY_WAIT_S = 30.0
# How often a caller waiting on a request looks at its cancel token.
CANCEL_POLL_S = 0.25


class ModelReply(BaseModel):
    """One reply: the assistant message, its usage, and why it finished."""

    message: Message
    usage: Usage
    finish_reason: str | None = None
    service_ms: float | None = None


class ModelClient:
    """Sends chat-completions requests to `base_url` with timeouts and bounded retries."""

    def __init__(self, settings: HarnessSettings, http: httpx.Client | None = None) -> None:
        if not settings.base_url:
            raise ProviderError("no model endpoint configured: set LLM_BASE_URL")
        self.settings = settings
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
        # Loading the CA bundle costs ~70 ms per client; a plain-http endpoint (a local model
        # server, the scripted provider) never uses it. https endpoints are verified as ever.
        plain_http = settings.base_url.startswith("http://")
        self.http = http or httpx.Client(
            base_url=settings.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=timeout,
            verify=not plain_http,
            # Drop an idle connection before the server does: many servers (uvicorn among
            # them) close keep-alive connections after 5 s, httpx's own default, and a
            # request sent on a connection the server is closing fails without an answer.
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        cancel: CancelToken | None = None,
    ) -> ModelReply:
        """Ask for the next assistant message; `Cancelled` the moment `cancel` is set, even
        mid-request (the request is abandoned: the server may still bill it)."""
        body: dict[str, Any] = {"model": model, "messages": [m.wire() for m in messages]}
        if tools:
            body["tools"] = tools
        for attempt in range(self.settings.max_retries + 1):
            response = self._post(body) if cancel is None else self._post_until(body, cancel)
            if response.status_code not in RETRYABLE or attempt == self.settings.max_retries:
                break
            wait = _retry_wait(response, attempt)
            if cancel is None:
                time.sleep(wait)
            else:
                cancel.sleep(wait)
        return _parse(response)

    def _post_until(self, body: dict[str, Any], cancel: CancelToken) -> httpx.Response:
        """`_post` on a helper thread, so that a cancel does not wait for the reply."""
        cancel.check()
        future = _requests().submit(self._post, body)
        while True:
            try:
                return future.result(timeout=CANCEL_POLL_S)
            except WaitTimeout:
                if cancel.cancelled:
                    raise Cancelled(cancel.reason or "cancelled") from None

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        try:
            return self.http.post("chat/completions", json=body)
        except httpx.TimeoutException as exc:
            raise ProviderError(f"model request timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise ProviderError(f"model request failed: {exc!r}") from exc


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()
MAX_REQUEST_THREADS = 64


def _requests() -> ThreadPoolExecutor:
    """This process's request threads (made after a fork, never inherited)."""
    with _pools_lock:
        pool = _pools.get(os.getpid())
        if pool is None:
            pool = _pools[os.getpid()] = ThreadPoolExecutor(
                MAX_REQUEST_THREADS, thread_name_prefix="tg-request"
            )
        return pool


def _retry_wait(response: httpx.Response, attempt: int) -> float:
    try:
        wait = float(response.headers.get("retry-after", ""))
    except ValueError:
        wait = 0.5 * 2**attempt
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)


def _parse(response: httpx.Response) -> ModelReply:
    if response.status_code != 200:
        raise ProviderError(
            f"model endpoint answered HTTP {response.status_code}: {_error_text(response)}",
            status=response.status_code,
        )
    try:
        data = response.json()
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return ModelReply(
            message=Message.model_validate({**choice["message"], "role": "assistant"}),
            usage=Usage(
                prompt_tokens=usage.get("prompt_tokens", 0),
                completion_tokens=usage.get("completion_tokens", 0),
            ),
            finish_reason=choice.get("finish_reason"),
            service_ms=_float_or_none(response.headers.get("x-service-ms")),
        )
    except (ValueError, KeyError, IndexError, TypeError, ValidationError) as exc:
        raise ProviderError(f"model endpoint sent a malformed reply: {exc!r}") from exc


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
