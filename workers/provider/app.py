"""The scripted provider's HTTP app: OpenAI chat completions and Anthropic Messages
answered from the same scenario.

    POST /v1/chat/completions   a scripted reply (or a scripted fault)
    POST /v1/messages           the same, in Anthropic's shape (anthropic_messages.py)
    GET  /stats                 requests, in-flight, tokens, per-script counts, the request
                                settings each script saw (`params`), the tools its last
                                request offered (`tools`), CPU seconds
    POST /stats/reset           zero the stats
    GET  /healthz               {"ok": true}

Every chat-completions response carries `X-Service-Ms`: the server's own handling time,
scripted latency included, so a client can tell its overhead from the "model's".
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from workers.provider import anthropic_messages, serving
from workers.provider.cassette import CHAT_PATH, MESSAGES_PATH, Cassette
from workers.provider.request import ChatRequest, ConversationView, protocol_error
from workers.provider.scenario import Fault, Scenario, Script
from workers.provider.wire import RenderedReply, render_reply

# What a proxy (nginx, a load balancer) sends when the server behind it fails.
HTML_ERROR = (
    "<html><head><title>{status}</title></head>\n<body><h1>{status} Bad Gateway</h1>"
    "<hr><center>nginx</center></body></html>\n"
)
# A body that starts like a completion and stops mid-way, as a truncated proxy reply would.
MALFORMED_BODY = b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{'


@dataclass
class Stats:
    """Counters of what the provider served; the app runs on one event loop, so no locks.

    `requests` counts every chat-completions request, however it was answered (faults and
    400s included); `scripts` counts the requests each script matched; tokens add up the
    usage of the replies actually sent. `cpu_s` is the CPU time (`time.process_time()`) the
    process has spent since the stats were created or last reset; with the provider in a
    background thread, that is the whole host process's, not the provider's alone.
    """

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    scripts: Counter[str] = field(default_factory=Counter)
    params: Counter[str] = field(default_factory=Counter)  # "script: max_tokens=… …" -> n
    # script -> the tools (name -> JSON schema of its parameters) its last request offered
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu_started: float = field(default_factory=time.process_time)
    # Requests whose client went away while they waited for their reply (a cancel cut
    # them), and when (wall clock, seconds since the epoch) the last one went, and the last
    # request of all arrived: what a test of cancel reads.
    abandoned: int = 0
    last_abandoned_at: float | None = None
    last_arrival_at: float | None = None
    rate_limited: int = 0  # requests answered 429 by the token rate (--tpm-limit)
    # Requests a strict endpoint (OpenAI's, Anthropic's) would refuse for breaking the
    # tool-call rules, by why (request.protocol_error); scripts are answered anyway, as tests
    # step a script's turns with calls left unanswered.
    protocol_errors: Counter[str] = field(default_factory=Counter)

    def begin(self) -> None:
        """A chat-completions request has arrived."""
        self.requests += 1
        self.last_arrival_at = time.time()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self) -> None:
        """A chat-completions request has been answered (in any way)."""
        self.in_flight -= 1

    def abandon(self) -> None:
        """A request's client left before its reply."""
        self.abandoned += 1
        self.last_abandoned_at = time.time()

    def record(self, script: Script, reply: RenderedReply | None) -> None:
        """Count a request `script` matched, and the tokens of its reply if it gave one."""
        self.scripts[script.name] += 1
        if reply is not None:
            self.prompt_tokens += reply.prompt_tokens
            self.completion_tokens += reply.completion_tokens

    def reset(self) -> None:
        """Zero the counters; requests still running stay counted in flight."""
        self.requests = self.prompt_tokens = self.completion_tokens = self.abandoned = 0
        self.rate_limited = 0
        self.last_abandoned_at = self.last_arrival_at = None
        self.max_in_flight = self.in_flight
        self.scripts.clear()
        self.params.clear()
        self.tools.clear()
        self.protocol_errors.clear()
        self.cpu_started = time.process_time()

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON-ready data."""
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "scripts": dict(self.scripts),
            "params": dict(self.params),
            "tools": dict(self.tools),
            "abandoned": self.abandoned,
            "rate_limited": self.rate_limited,
            "protocol_errors": dict(self.protocol_errors),
            "last_abandoned_at": self.last_abandoned_at,
            "last_arrival_at": self.last_arrival_at,
            "cpu_s": round(time.process_time() - self.cpu_started, 6),
        }


class FaultCounters:
    """How often each limited fault has fired: the only state kept across requests."""

    def __init__(self) -> None:
        self._fired: Counter[tuple[str, int]] = Counter()

    def take(self, script: Script, turn: int) -> Fault | None:
        """The first fault that applies to this request, counted as fired; None if none does."""
        for index, fault in enumerate(script.faults):
            key = (script.name, index)
            if fault.applies_to(turn) and (fault.times is None or self._fired[key] < fault.times):
                self._fired[key] += 1
                return fault
        return None


class TokenRate:
    """A hosted API's tokens-per-minute limit: a request whose tokens would take the last
    `window_s` over `limit` is answered 429 with the Retry-After that would admit it."""

    def __init__(self, limit: int, window_s: float = 60.0) -> None:
        self.limit, self.window_s = limit, window_s
        self._served: deque[tuple[float, int]] = deque()
        self._sum = 0

    def admit(self, tokens: int) -> float | None:
        """Count `tokens` served now and return None, or the seconds to wait (not counted)."""
        now = time.monotonic()
        while self._served and self._served[0][0] <= now - self.window_s:
            self._sum -= self._served.popleft()[1]
        if self._served and self._sum + tokens > self.limit:
            return max(self._served[0][0] + self.window_s - now, 0.001)
        self._served.append((now, tokens))
        self._sum += tokens
        return None


@dataclass
class ProviderState:
    """What one app serves from and keeps: its scenario, stats and fault counters."""

    scenario: Scenario
    stats: Stats = field(default_factory=Stats)
    faults: FaultCounters = field(default_factory=FaultCounters)
    rate: TokenRate | None = None
    cassette: Cassette | None = None  # set: every request is answered from it (replay)


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, messages_api: bool = False
) -> Response:
    """An OpenAI-style error body, {"error": {"message", "type"}}, or Anthropic's."""
    if messages_api:
        return JSONResponse(
            anthropic_messages.error_body(status, message), status_code=status, headers=headers
        )
    body = {"error": {"message": message, "type": _error_type(status)}}
    return JSONResponse(body, status_code=status, headers=headers)


def _error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def completion_body(request: ChatRequest, reply: RenderedReply) -> dict[str, Any]:
    """The chat.completion envelope around one rendered reply."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [{"index": 0, "message": reply.message, "finish_reason": reply.finish_reason}],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


async def _parse(http: Request) -> ChatRequest | Response:
    """The request body as a ChatRequest, or the 400 response explaining why it is not one."""
    try:
        return ChatRequest.model_validate(json.loads(await http.body()))
    except ValidationError as exc:
        problem = _first_error(exc)
    except ValueError as exc:  # not JSON at all (or not UTF-8)
        problem = str(exc)
    return error_response(400, f"not a chat-completions request: {problem}")


async def _parse_messages(http: Request) -> ChatRequest | Response:
    """A Messages request body as a ChatRequest, or the 400 response (in Anthropic's shape)
    explaining why it is not one."""
    try:
        return anthropic_messages.to_chat(json.loads(await http.body()))
    except ValidationError as exc:
        problem = _first_error(exc)
    except (ValueError, AttributeError) as exc:
        problem = str(exc)
    return error_response(400, f"not a Messages request: {problem}", messages_api=True)


def _first_error(exc: ValidationError) -> str:
    """The first thing wrong with a request, as `where.in.the.body: what`."""
    first = exc.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"


async def _answer(
    request: ChatRequest, state: ProviderState, http: Request, messages_api: bool = False
) -> Response:
    """Match a script, play its fault or latency, and render the reply for this turn; a
    client that leaves meanwhile is counted as abandoned (nobody reads the reply). A request
    that breaks the tool-call rules is counted (Stats.protocol_errors), then answered."""
    if (problem := protocol_error(request)) is not None:
        state.stats.protocol_errors[problem] += 1
    matched = state.scenario.match(ConversationView.of(request))
    if matched is None:
        message = f"no script matched the request (model {request.model!r})"
        return error_response(400, message, messages_api=messages_api)
    script, turn = matched.script, request.turn
    state.stats.params[f"{script.name}: {request.params}"] += 1
    if request.tools:
        offered = (t.get("function", t) for t in request.tools)
        state.stats.tools[script.name] = {t.get("name"): t.get("parameters") for t in offered}
    fault = state.faults.take(script, turn)
    if fault is not None:
        if await _client_left(http, fault.hang_ms / 1000):
            return _abandoned(state)
        if fault.status is not None or fault.malformed or fault.reset:
            state.stats.record(script, None)
            return _fault_response(fault, script, turn, messages_api)
    if await _client_left(http, script.latency_ms / 1000):
        return _abandoned(state)
    reply = script.reply_for(turn)
    if reply is None:
        state.stats.record(script, None)
        replies = len(script.replies)
        message = f"script {script.name!r} has no reply for turn {turn} (it has {replies})"
        return error_response(500, message, messages_api=messages_api)
    rendered = render_reply(reply, request, matched.groups)
    if state.rate is not None:
        wait_s = state.rate.admit(rendered.prompt_tokens + rendered.completion_tokens)
        if wait_s is not None:
            state.stats.record(script, None)
            state.stats.rate_limited += 1
            headers = {"Retry-After": f"{math.ceil(wait_s)}"}
            message = f"rate limit: {state.rate.limit} tokens per {state.rate.window_s:g} s"
            return error_response(429, message, headers, messages_api)
    state.stats.record(script, rendered)
    if messages_api:
        return JSONResponse(anthropic_messages.message_body(request, rendered))
    return JSONResponse(completion_body(request, rendered))


async def _client_left(http: Request, seconds: float) -> bool:
    """Wait `seconds` (the scripted latency); True, at once, if the client disconnects
    meanwhile. The body was read, so the next ASGI message is the disconnect."""
    if seconds <= 0:
        return False
    try:
        message = await asyncio.wait_for(http.receive(), seconds)
    except TimeoutError:
        return False
    return message.get("type") == "http.disconnect"


def _abandoned(state: ProviderState) -> Response:
    state.stats.abandon()
    return Response(status_code=499)  # nobody reads it: the client left


def _fault_response(
    fault: Fault, script: Script, turn: int, messages_api: bool = False
) -> Response:
    """The response a status, malformed or reset fault scripts."""
    if fault.malformed:
        return Response(MALFORMED_BODY, media_type="application/json")
    if fault.reset:
        return StreamingResponse(_cut_off(), media_type="application/json")
    assert fault.status is not None
    if fault.html:
        page = HTML_ERROR.format(status=fault.status)
        return Response(page, status_code=fault.status, media_type="text/html")
    headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else None
    message = f"scripted fault: status {fault.status} (script {script.name!r}, turn {turn})"
    return error_response(fault.status, message, headers, messages_api)


async def _cut_off() -> AsyncIterator[bytes]:
    """Half a completion, then the connection drops (the server raises mid-body)."""
    yield MALFORMED_BODY
    raise ConnectionResetError("scripted fault: connection reset mid-body")


async def chat_completions(http: Request) -> Response:
    """POST /v1/chat/completions."""
    return await _served(http, CHAT_PATH, _parse)


async def messages(http: Request) -> Response:
    """POST /v1/messages: the same scripts, in Anthropic's Messages shape."""
    return await _served(http, MESSAGES_PATH, _parse_messages)


async def _served(
    http: Request, path: str, parse: Callable[[Request], Awaitable[ChatRequest | Response]]
) -> Response:
    """One model request to `path`: replayed from the cassette if there is one, else
    `parse`d and answered from the scenario; counted in flight meanwhile, and timed in
    `X-Service-Ms` (a replay says 0)."""
    started = time.perf_counter()
    state: ProviderState = http.app.state.provider
    state.stats.begin()
    try:
        if state.cassette is not None:
            return await _replayed(http, state.cassette, path)
        parsed = await parse(http)
        messages_api = path == MESSAGES_PATH
        if isinstance(parsed, ChatRequest):
            response = await _answer(parsed, state, http, messages_api=messages_api)
        else:
            response = parsed
    finally:
        state.stats.end()
    response.headers["X-Service-Ms"] = f"{(time.perf_counter() - started) * 1000:.3f}"
    return response


async def _replayed(http: Request, cassette: Cassette, path: str) -> Response:
    """The recorded response to this request, or a 400 naming the cassette and the miss."""
    messages_api = path == MESSAGES_PATH
    try:
        body = json.loads(await http.body())
    except ValueError as exc:
        return error_response(400, f"not a JSON request: {exc}", messages_api=messages_api)
    response = cassette.replay(path, body) if isinstance(body, dict) else None
    if response is None:
        stats: Stats = http.app.state.provider.stats
        stats.scripts["cassette-miss"] += 1
        message = cassette.miss(path, body if isinstance(body, dict) else {})
        return error_response(400, message, messages_api=messages_api)
    http.app.state.provider.stats.scripts["cassette"] += 1
    return JSONResponse(response, headers={"X-Service-Ms": "0"})


async def get_stats(http: Request) -> Response:
    """GET /stats."""
    return JSONResponse(http.app.state.provider.stats.snapshot())


async def reset_stats(http: Request) -> Response:
    """POST /stats/reset."""
    stats: Stats = http.app.state.provider.stats
    stats.reset()
    return JSONResponse(stats.snapshot())


def create_app(scenario: Scenario | Cassette, rate: TokenRate | None = None) -> Starlette:
    """A Starlette app that answers chat completions from `scenario`, or replays a cassette
    (limited to `rate`)."""
    reset = Route("/stats/reset", reset_stats, methods=["POST"])
    app = serving.app(chat_completions, messages, get_stats, reset)
    if isinstance(scenario, Cassette):
        empty = Scenario(source=scenario.source, scripts=[])
        app.state.provider = ProviderState(empty, rate=rate, cassette=scenario)
    else:
        app.state.provider = ProviderState(scenario, rate=rate)
    return app
