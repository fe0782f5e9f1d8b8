"""One thread's keep-alive connection to the model endpoint, on the standard library's
http.client.

A model request through httpx's transport cost 500-570 µs of CPU on loopback, four fifths
of it in httpx/httpcore/h11's pure-Python HTTP/1.1 stack; the same request on http.client
cost 150-200 (BENCHMARKS.md #21, thirteenth step). Every thread of a worker already sent
on a connection of its own (one request in flight a thread), so no pool is needed here:
a thread keeps one connection, reuses it while the server keeps it open, and drops it once
idle for `keepalive_s` (before the server does: a request sent on a connection the server
is closing fails without an answer) or when the server closed it meanwhile (the socket
reads ready with no request out, as httpcore checks too).

A request can be cut from another thread (`abortable.Cut`): the cut shuts that request's
socket down, the read returns at once, the connection is dropped, and the server sees the
client go. httpx stays for every endpoint this does not serve (a proxy from the
environment, credentials in the URL; workers/model/client.py decides).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from typing import Any

from workers.model import abortable


@dataclass(frozen=True)
class Answer:
    """A reply as the client reads it: status, headers (looked up in any case), body."""

    status: int
    headers: Message | Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON (ValueError if it is not)."""
        return json.loads(self.body)


class Connection:
    """The calling thread's connection to one origin (scheme, host, port); not shared."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        connect_s: float,
        read_s: float,
        keepalive_s: float,
        context: ssl.SSLContext | None = None,
    ) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.connect_s, self.read_s, self.keepalive_s = connect_s, read_s, keepalive_s
        self.context = context
        self._conn: http.client.HTTPConnection | None = None
        self._idle_since = 0.0
        self._pid = os.getpid()

    def post(
        self, path: str, body: bytes, headers: Mapping[str, str], cut: abortable.Cut | None
    ) -> Answer:
        """POST `body` and read the whole reply. Raises what the socket or http.client
        raise (OSError, TimeoutError, http.client.HTTPException, ValueError for a header
        http.client refuses); the connection is then dropped, never reused."""
        conn = self._ready()
        if cut is not None:
            # This request's socket, held apart from the connection: http.client lets go of
            # it once a reply says the connection will close, while the body is still read
            # from it; and a late cut must never reach the socket of a later request.
            cut.attach(abortable.Socket(conn.sock))
        try:
            try:
                conn.request("POST", path, body, headers)
            except (BrokenPipeError, ConnectionResetError):
                # The server answered before it read the whole body (a 413, a 401) and
                # closed: its answer is the news, as httpcore reads it too; else the error.
                response = _early_answer(conn)
                if response is None:
                    raise
            else:
                response = conn.getresponse()
            data = response.read()
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        else:
            self._idle_since = time.monotonic()
        return Answer(response.status, response.msg, data)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _ready(self) -> http.client.HTTPConnection:
        """The open connection, or a new one if there is none or it may be closing."""
        if self._pid != os.getpid():  # inherited over a fork: the parent's, not to touch
            self._conn, self._pid = None, os.getpid()
        conn = self._conn
        if conn is not None and self._stale(conn):
            self.close()
            conn = None
        if conn is None:
            conn = self._conn = self._connect()
        return conn

    def _stale(self, conn: http.client.HTTPConnection) -> bool:
        """Idle too long, or closed by the server: the socket reads ready with no request
        out (an end of file, or what nobody asked for), as httpcore checks too."""
        if conn.sock is None or time.monotonic() - self._idle_since > self.keepalive_s:
            return True
        poll = select.poll()
        poll.register(conn.sock, select.POLLIN)
        return bool(poll.poll(0))

    def _connect(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.connect_s, context=self.context
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_s)
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(self.read_s)
        self._idle_since = time.monotonic()
        return conn


def _early_answer(conn: http.client.HTTPConnection) -> http.client.HTTPResponse | None:
    """The reply a server sent before a send to it failed, if it can still be read."""
    try:
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None
