"""What the scripted provider (app.py, server.py) and the recording proxy (recorder.py) share
to serve: the routes both answer, their uvicorn configuration, and running one in a
background thread for as long as a `with` block lasts.

Light on purpose (uvicorn and Starlette only): the recorder imports it without the
scenario models the scripted provider needs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

STARTUP_TIMEOUT_S = 10.0

Endpoint = Callable[[Request], Awaitable[Response]]


async def healthz(_http: Request) -> Response:
    """GET /healthz."""
    return JSONResponse({"ok": True})


def app(chat_completions: Endpoint, messages: Endpoint, stats: Endpoint, *more: Route) -> Starlette:
    """An app answering both model APIs (POST /v1/chat/completions and /v1/messages), GET
    /stats, GET /healthz, and the routes `more`."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
            *more,
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def server(app: Starlette, host: str, port: int, log_level: str, **tuning: Any) -> uvicorn.Server:
    """A uvicorn server for `app` (`tuning`: further uvicorn.Config settings)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # No lifespan: the apps have no startup work, and uvicorn's probe would only log
        # noise. Named, not "auto": no probing for httptools and uvloop, and no import of
        # the websockets library for an API that serves none (~15 ms of every embedded run).
        lifespan="off",
        http="h11",
        ws="none",
        loop="asyncio",
        **tuning,
    )
    return uvicorn.Server(config)


@contextmanager
def in_thread(
    server: uvicorn.Server,
    name: str,
    host: str,
    force_exit: bool = True,
    join_s: float | None = 10.0,
) -> Iterator[str]:
    """Run `server` in a daemon thread called `name`; yield its base URL
    (`http://host:port/v1`, the port it bound). On the way out it is told to stop
    (`force_exit`: without waiting for open connections) and waited for up to `join_s`
    seconds (None: not waited for)."""
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        if force_exit:
            server.force_exit = True
        if join_s is not None:
            thread.join(join_s)


def _wait_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    """Block until uvicorn listens; raise if it died or took too long."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the scripted provider failed to start (see the log above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the scripted provider did not start in {STARTUP_TIMEOUT_S} s")
        time.sleep(0.005)
