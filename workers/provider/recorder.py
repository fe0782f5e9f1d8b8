"""The recording proxy: forwards model requests to the real endpoint and keeps each exchange
in a cassette (cassette.py), written after every reply so a killed run loses none.

    POST /v1/chat/completions, /v1/messages   forwarded to UPSTREAM, the reply sent back
                                              as it came; a 200 reply is recorded
    GET  /stats                               {"requests", "recorded", "cassette"}
    GET  /healthz                             {"ok": true}

Only replies the model gave (HTTP 200) are kept: a 429 or a 5xx is the client's to retry,
and its retry is the exchange worth recording.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from workers.provider import serving
from workers.provider.cassette import CHAT_PATH, MESSAGES_PATH, Cassette, load_cassette

# Headers a model endpoint reads: the credentials and the API version; the rest is the
# proxy's own (host, content-length) or the client's business.
FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")
UPSTREAM_TIMEOUT_S = 600.0


@dataclass
class Recording:
    """Where exchanges go, and what was seen."""

    cassette: Cassette
    path: Path
    upstream: str
    requests: int = 0
    recorded: int = 0


async def _forward(http: Request, api_path: str) -> Response:
    recording: Recording = http.app.state.recording
    recording.requests += 1
    raw = await http.body()
    headers = {k: v for k, v in http.headers.items() if k.lower() in FORWARDED}
    headers["content-type"] = "application/json"
    async with httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT_S) as client:
        reply = await client.post(f"{recording.upstream}/{api_path}", content=raw, headers=headers)
    if reply.status_code == 200:
        try:
            body, response = json.loads(raw), reply.json()
        except ValueError:
            body = response = None
        kept_dicts = isinstance(body, dict) and isinstance(response, dict)
        if kept_dicts and recording.cassette.add(api_path, body, response):  # type: ignore[arg-type]
            recording.recorded += 1
            recording.cassette.save(recording.path)
    kept = {k: v for k, v in reply.headers.items() if k.lower() in ("retry-after",)}
    return Response(reply.content, reply.status_code, kept, reply.headers.get("content-type"))


async def chat_completions(http: Request) -> Response:
    """POST /v1/chat/completions, forwarded and recorded."""
    return await _forward(http, CHAT_PATH)


async def messages(http: Request) -> Response:
    """POST /v1/messages, forwarded and recorded."""
    return await _forward(http, MESSAGES_PATH)


async def stats(http: Request) -> Response:
    """GET /stats."""
    recording: Recording = http.app.state.recording
    return JSONResponse(
        {
            "requests": recording.requests,
            "recorded": recording.recorded,
            "cassette": str(recording.path),
        }
    )


def create_app(cassette_path: Path, upstream: str) -> Starlette:
    """A proxy to `upstream` (a base URL ending in /v1) that records into `cassette_path`
    (appending to what it holds already)."""
    app = serving.app(chat_completions, messages, stats)
    cassette = load_cassette(cassette_path, missing_ok=True)
    app.state.recording = Recording(cassette, cassette_path, upstream.rstrip("/"))
    return app


def server(cassette_path: Path, upstream: str, host: str, port: int) -> uvicorn.Server:
    """A uvicorn server for the proxy."""
    return serving.server(create_app(cassette_path, upstream), host, port, "warning")


@contextmanager
def recording_proxy(
    cassette_path: Path, upstream: str, host: str = "127.0.0.1", port: int = 0
) -> Iterator[str]:
    """Run the proxy in a background thread; yield its base URL (…/v1). On the way out it
    stops gracefully (a request in flight may still finish and be recorded)."""
    proxy = server(cassette_path, upstream, host, port)
    with serving.in_thread(proxy, "recording-proxy", host, force_exit=False) as url:
        yield url
