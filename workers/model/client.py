"""The model client: one model request over HTTP, errors translated here.

Each thread sends on a keep-alive connection of its own: the standard library's http.client
(workers/model/connection.py) for an endpoint httpx would reach directly, httpx's transport
behind a proxy from the environment or with credentials in the URL.

What goes over the wire is the API module's business (openai_wire.py: chat completions;
anthropic_wire.py: Messages); this module does the rest, the same for both: timeouts,
retries with backoff, cancellation, and errors a person can act on. It knows nothing about
scripts.
"""

from __future__ import annotations

import base64
import functools
import http.client
import ipaddress
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WaitTimeout
from typing import Any

import httpx
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from workers.cancel import CancelToken
from workers.errors import Cancelled, ProviderError
from workers.meter import worst_tokens
from workers.model import abortable, pool_guard
from workers.model.connection import Answer, Connection
from workers.model.gate import Gate, OnWait, Slot
from workers.model.wire import anthropic as anthropic_wire
from workers.model.wire import openai as openai_wire
from workers.model.wire.reply import ModelReply, RequestParams
from workers.settings import HarnessSettings
from workers.state import Message

__all__ = ["ModelClient", "ModelReply", "RequestParams", "refused"]

KEEPALIVE_S = 2.0
MAX_RETRY_WAIT_S = 30.0
FIRST_RETRY_WAIT_S = 0.5
# How often a caller waiting on a request looks at its cancel token.
CANCEL_POLL_S = 0.25


class ModelClient:
    """Sends one model request to `base_url`, in the API `settings.api` names (OpenAI chat
    completions or Anthropic Messages), with timeouts, bounded retries and cancellation."""

    def __init__(
        self, settings: HarnessSettings, http: httpx.Client | None = None, gate: Gate | None = None
    ) -> None:
        if not settings.base_url:
            raise ProviderError("no model endpoint configured: set LLM_BASE_URL")
        self.settings = settings
        self.gate = gate  # the endpoint's shared caps (requests in flight, tokens per minute)
        self.api = anthropic_wire if settings.api == "anthropic" else openai_wire
        # Loading the CA bundle costs ~70 ms, and even an unverified context ~20 ms: built once
        # for every connection pool of this client. A plain-http endpoint (a local model
        # server, the scripted provider) never uses it; https endpoints are verified as ever.
        self._ssl = httpx.create_ssl_context(verify=not settings.base_url.startswith("http://"))
        self.http = http or self._new_http()
        # Each request goes straight to the transport httpx picked for the endpoint (its pool,
        # or a proxy's from the environment): the Client's own send (auth and redirect flows,
        # cookies, event hooks, merging URL and headers) cost as much CPU again as the request
        # (0.69 against 0.36 ms a request, BENCHMARKS.md #21), for nothing this client uses.
        # A client passed in keeps its headers and timeout; its auth or hooks would not run.
        base = self.http.base_url if http else httpx.URL(settings.base_url)
        self._url = under(base, self.api.PATH)  # a query in LLM_BASE_URL kept (Azure's)
        self._headers = httpx.Headers({**self.http.headers, "content-type": "application/json"})
        if self._url.username or self._url.password:  # as httpx's client: Basic, over any other
            self._headers["authorization"] = _basic(self._url)
        self._extensions = {"timeout": self.http.timeout.as_dict()}
        # A client passed in (tests) is shared by every thread as it is, and waited on from a
        # helper thread so that a cancel does not wait for its reply. Otherwise each thread
        # that sends gets a connection of its own: on http.client (workers/model/connection.py)
        # when httpx would send straight to the endpoint, else a pool of its own
        # (`_transport`: a proxy from the environment, credentials in the URL).
        self._shared = http is not None
        self._native = not self._shared and _direct(self.http, self._url)
        self._path = self._url.raw_path.decode("ascii")
        self._native_headers = {**self.http.headers, "content-type": "application/json"}
        for name in ("accept-encoding", "connection"):  # http.client's own: identity, keep-alive
            self._native_headers.pop(name, None)
        for name, value in self._native_headers.items():
            if any(c in value for c in "\r\n\0"):  # never sent: named, its value not shown
                raise ProviderError(
                    f"the {name} header of model requests holds a line break or NUL: check "
                    "LLM_API_KEY (a key copied with its newline?)"
                )
        if self._native:  # as httpcore offers it on the connections it opens
            self._ssl.set_alpn_protocols(["http/1.1"])
        self._local = threading.local()
        # Each thread's own connection (or httpx client), closed with this one.
        self._per_thread: list[httpx.Client | Connection] = []
        self._per_thread_lock = threading.Lock()
        # The threads' pools are made as this one is: if it can be cut, so can they.
        self.cuttable = self._native or (not self._shared and abortable.install(self.http))

    def _new_http(self) -> httpx.Client:
        """An httpx client for the endpoint with this client's settings (no connection yet)."""
        settings = self.settings
        return httpx.Client(
            base_url=under(httpx.URL(settings.base_url or ""), "").copy_with(query=None),
            headers=self.api.headers(settings.api_key),
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            verify=self._ssl,
            # Drop an idle connection before the server does: many servers (uvicorn among
            # them) close keep-alive connections after 5 s, httpx's own default, and a
            # request sent on a connection the server is closing fails without an answer.
            # No cap of its own: a thread has one request in flight at a time, and every
            # connection is kept alive (httpx's default keeps 20 of 100: a busy worker opened
            # one per request). A cap of 64 held the fleet regime to 128 in flight.
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S
            ),
        )

    def _connection(self) -> Connection:
        """This thread's own connection to the endpoint (workers/model/connection.py)."""
        connection: Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            url, timeout = self._url, self.http.timeout
            connection = Connection(
                url.scheme,
                url.raw_host.decode("ascii"),  # IDNA-encoded as httpx connects
                url.port or (443 if url.scheme == "https" else 80),
                connect_s=timeout.connect or self.settings.connect_timeout_s,
                read_s=timeout.read or self.settings.read_timeout_s,
                keepalive_s=KEEPALIVE_S,
                context=self._ssl,
            )
            self._local.connection = connection
            with self._per_thread_lock:
                self._per_thread.append(connection)
        return connection

    def _transport(self) -> httpx.BaseTransport:
        """The transport this thread sends on when httpx sends (a proxy, credentials in the
        URL, a client passed in): its own connection pool for the endpoint.

        One pool shared by a worker's threads cost a fifth of its CPU at 256 threads (the
        fleet regime of BENCHMARKS.md): every request and every reply walks the pool's
        connections, one per thread, under one lock. A thread's own pool holds the one
        connection it uses (kept alive for its next request), so those walks are short and
        no thread waits for another's. Its connections are made cuttable (abortable) and
        guarded (pool_guard) as the shared client's are."""
        transport: httpx.BaseTransport | None = getattr(self._local, "transport", None)
        if transport is not None:
            return transport
        client = self.http
        if not self._shared:
            client = self._new_http()
            abortable.install(client)
            pool_guard.guard(client)
            with self._per_thread_lock:
                self._per_thread.append(client)
        transport = client._transport_for_url(self._url)  # private; httpx is pinned
        self._local.transport = transport
        return transport

    def close(self) -> None:
        """Close the connection pools (the threads' own too)."""
        with self._per_thread_lock:
            pools, self._per_thread = self._per_thread, []
        for client in pools:
            client.close()
        self.http.close()

    def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        cancel: CancelToken | None = None,
        params: RequestParams | None = None,
        on_wait: OnWait | None = None,
    ) -> ModelReply:
        """Ask for the next assistant message.

        Transient failures (408, 409, 429, 5xx, refused or reset connections, timeouts, a
        malformed body) are retried with exponential backoff and full jitter, honouring
        `Retry-After`, at most `max_retries` times and within `retry_max_s`. `Cancelled` the
        moment `cancel` is set, even mid-request or mid-wait: the request's connection is
        cut, so the server sees it abandoned (it may still bill what it produced). With a
        gate, every attempt first waits for its place under the endpoint's caps (`on_wait`
        hears when such a wait starts and ends).
        """
        body = self.api.body(model, messages, tools, params)
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
            wait=_wait,
            stop=stop_after_attempt(self.settings.max_retries + 1)
            | stop_after_delay(self.settings.retry_max_s),
            sleep=cancel.sleep if cancel is not None else time.sleep,
            reraise=True,
        )
        tokens = 0  # what the request may use, if the gate caps tokens: counted once
        if self.gate is not None and self.gate.counts_tokens:
            max_tokens = params.max_tokens if params is not None else None
            tokens = sum(worst_tokens(messages, tools, max_tokens))
        waited: list[bool] = []
        attempt = functools.partial(self._once, body, messages, tools, cancel)
        reply: ModelReply = retrying(
            self._gated, attempt, body["model"], tokens, cancel, waited, on_wait
        )
        reply.usage.waited = any(waited)
        return reply

    def _gated(
        self,
        attempt: Callable[[], ModelReply],
        model: str,
        tokens: int,
        cancel: CancelToken | None,
        waited: list[bool],
        on_wait: OnWait | None = None,
    ) -> ModelReply:
        """One `attempt` at `model`, in its place under the gate's caps (if any)."""
        if self.gate is None:
            return attempt()
        slot: Slot = self.gate.enter(model, tokens, cancel, on_wait)
        waited.append(slot.waited)
        used: int | None = None
        try:
            reply = attempt()
            used = reply.usage.total_tokens
            return reply
        except ProviderError as exc:
            if exc.status == 429:
                self.gate.cool_down(model, exc.retry_after or FIRST_RETRY_WAIT_S)
            raise
        finally:
            slot.done(used)

    def _once(
        self,
        body: dict[str, Any],
        messages: list[Message],
        tools: list[dict[str, Any]],
        cancel: CancelToken | None,
    ) -> ModelReply:
        answer = self._post(body) if cancel is None else self._post_until(body, cancel)
        if answer.status != 200:
            raise _http_error(answer, self.where, self.api.error_text)
        try:
            data = answer.json()
        except ValueError as exc:
            shown = answer.text[:200]
            raise ProviderError(f"{self.where} sent a body that is not JSON: {shown!r}") from exc
        reply = self.api.parse(data, self.where, messages, tools)
        reply.service_ms = _float_or_none(answer.headers.get("x-service-ms"))
        return reply

    @functools.cached_property
    def where(self) -> str:
        """The endpoint, without credentials, query or fragment (never sent), for messages
        (made once: a request's errors name it, and parsing the URL again for every request
        cost more than the JSON)."""
        url = httpx.URL(self.settings.base_url or "")
        shown = url.copy_with(username=None, password=None, query=None, fragment=None)
        return str(shown).rstrip("/")

    @functools.cached_property
    def endpoint(self) -> str:
        """Where requests go, without credentials, for messages."""
        return f"{self.where}/{self.api.PATH}"

    def _post_until(self, body: dict[str, Any], cancel: CancelToken) -> Answer:
        """`_post` that a cancel ends at once: the cancel cuts the request's connection
        (workers/model/abortable.py), so its read returns and the request raises `Cancelled`.

        The request runs on the calling thread: a hop to a helper thread and back cost a
        sixth of a worker's CPU (futures, a thread per request, GIL hand-offs). Only a
        client whose connections cannot be cut (one passed in) is waited on from a helper
        thread, so that a cancel still does not wait for its reply."""
        cancel.check()
        cut = abortable.Cut()

        def send() -> Answer:
            with abortable.cuttable(cut):
                return self._post(body, cut)

        forget = cancel.on_cancel(cut.cut)
        try:
            return send() if self.cuttable else _waited(_requests().submit(send), cancel)
        except ProviderError:
            if cancel.cancelled:  # the cut connection's error: the cancel is the news
                raise Cancelled(cancel.reason or "cancelled") from None
            raise
        finally:
            forget()

    def _post(self, body: dict[str, Any], cut: abortable.Cut | None = None) -> Answer:
        # As httpx's own `json=` encodes a body.
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            if self._native:
                return self._connection().post(
                    self._path, content.encode("utf-8"), self._native_headers, cut
                )
            return self._post_httpx(content.encode("utf-8"))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise ProviderError(
                f"no answer from {self.endpoint} in time ({type(exc).__name__}); a slow model "
                f"may need a longer LLM_READ_TIMEOUT_S (now {self.settings.read_timeout_s:g} s)"
            ) from exc
        except (OSError, http.client.HTTPException, httpx.HTTPError) as exc:
            raise ProviderError(
                f"cannot reach {self.endpoint}: {exc or type(exc).__name__}; check LLM_BASE_URL "
                "and that the server is up"
            ) from exc
        except ValueError as exc:  # what http.client refuses to send (after SSL's errors)
            raise ProviderError(f"cannot send to {self.endpoint}: {type(exc).__name__}") from None

    def _post_httpx(self, content: bytes) -> Answer:
        request = httpx.Request(
            "POST", self._url, headers=self._headers, content=content, extensions=self._extensions
        )
        response = self._transport().handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return Answer(response.status_code, response.headers, response.content)


def refused(settings: HarnessSettings) -> str | None:
    """Why the endpoint turns a connection away, if it does (a model server that is not
    started): one TCP connection to it, closed at once, no request sent. Tried only where
    it answers at once and for certain: an endpoint reached directly (no proxy from the
    environment) at an IP address or `localhost`, so no name lookup can hang. None when a
    connection opens, or when it cannot be told that cheaply (a host name, a proxy, a
    timeout: a slow network may still answer the run's requests)."""
    url = httpx.URL(settings.base_url or "")
    host = url.host
    if not _named_locally(host) or _proxied(url.scheme, host):
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=min(settings.connect_timeout_s, 3)).close()
    except ConnectionRefusedError:
        return f"connection refused at {host}:{port}"
    except OSError:
        return None
    return None


def _named_locally(host: str) -> bool:
    """True for an IP address or localhost: reached without asking a name server."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _proxied(scheme: str, host: str) -> bool:
    """True if the environment sends requests to `host` through a proxy (HTTP_PROXY,
    HTTPS_PROXY, ALL_PROXY, less NO_PROXY), as httpx reads it."""
    import urllib.request  # asked once a run, before it claims: not worth every import

    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass_environment(host, proxies)


def under(base: httpx.URL, path: str) -> httpx.URL:
    """`path` (`chat/completions`) under the base URL's path, its query kept: Azure OpenAI's
    `https://h/openai/deployments/d?api-version=V` asks `.../d/chat/completions?api-version=V`
    (httpx's `join` would drop the last segment and the query, and its client's base URL would
    end the query with its trailing slash)."""
    raw, _, query = base.raw_path.partition(b"?")  # encoded as given: %2F, %3F kept
    joined = raw.rstrip(b"/") + b"/" + path.encode("ascii")
    return base.copy_with(raw_path=joined + (b"?" + query if query else b""))


def _basic(url: httpx.URL) -> str:
    """The Authorization header of the credentials in `url` (httpx sends the same when its
    client sends; this client sends to the transport, past the client's auth step)."""
    userpass = f"{url.username}:{url.password}".encode()
    return f"Basic {base64.b64encode(userpass).decode('ascii')}"


def _direct(client: httpx.Client, url: httpx.URL) -> bool:
    """True if httpx would send to `url` straight over its default transport: no proxy
    mount applies, and the URL carries no credentials (httpx would send them as Basic)."""
    plain = url.scheme in ("http", "https") and not url.userinfo
    return plain and client._transport_for_url(url) is client._transport  # private; pinned


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


def _waited(future: Future[Answer], cancel: CancelToken) -> Answer:
    """The future's result, looking at `cancel` every CANCEL_POLL_S while it runs."""
    while True:
        try:
            return future.result(timeout=CANCEL_POLL_S)
        except WaitTimeout:
            if cancel.cancelled:
                raise Cancelled(cancel.reason or "cancelled") from None


def _wait(state: RetryCallState) -> float:
    """Retry-After when the server sent one, else exponential backoff with full jitter."""
    exc = state.outcome.exception() if state.outcome is not None else None
    after = getattr(exc, "retry_after", None)
    if after is not None:
        return float(min(max(after, 0.0), MAX_RETRY_WAIT_S))
    jitter = wait_random_exponential(multiplier=FIRST_RETRY_WAIT_S, max=MAX_RETRY_WAIT_S)
    return float(jitter(state))


def _http_error(
    response: Answer, where: str, error_text: Callable[[Any], str | None]
) -> ProviderError:
    status = response.status
    hint = {
        401: "check LLM_API_KEY",
        403: "check LLM_API_KEY and what it may use",
        404: "check LLM_BASE_URL (it usually ends in /v1) and the model name",
    }.get(status, "")
    text = f"{where} answered HTTP {status}: {_error_text(response, error_text)}"
    error = ProviderError(f"{text}; {hint}" if hint else text, status=status)
    error.retry_after = _float_or_none(response.headers.get("retry-after"))
    return error


def _error_text(response: Answer, error_text: Callable[[Any], str | None]) -> str:
    try:
        found = error_text(response.json())
    except ValueError:
        found = None
    if found is not None:
        return found
    text = " ".join(response.text.split())  # an HTML error page, on one line
    return text[:300] or "(empty body)"


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
