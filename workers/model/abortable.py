"""Model requests a cancel can cut, so that the server sees them abandoned.

A request blocks in its socket's read until the reply (on the task's own thread,
workers/model/client.py); a cancel once stopped only the wait for it, while the request
went on to its end (tens of seconds with a slow model), holding a thread and a connection,
and the server went on producing a reply nobody read. Here the socket a request reads or
writes is shut down from the cancelling thread: the read returns at once, httpcore drops
the connection, and the server sees the client go.

`install` puts a network backend that keeps track of this into an httpx client's
connection pools (httpx has no public hook for it; the test of cancel through a real server
proves it still holds on an upgrade). A request runs under `cuttable(cut)`; every stream it
touches on its thread is attached to `cut`, and `cut.cut()` shuts down the one it uses now
and any it opens later. A cut that comes after the request ended does nothing (a pooled
connection whose socket was shut down reads as closed, and httpcore never reuses it).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

from workers.model import pool_guard

_current = threading.local()


class Socket:
    """A request's socket, as a cut shuts it down: not closed (its reader still owns it),
    shut down, the plain socket's shutdown also under TLS (the SSL object stays with its
    reading thread). Once the socket is closed this does nothing (Python forgets its
    descriptor, so a number given to another file is never touched)."""

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock

    def shut(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class Cut:
    """One request's switch: `cut()` shuts down the connection it uses, now or later."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: Socket | None = None
        self._cut = self._done = False

    def attach(self, sock: Socket) -> None:
        """The request now uses `sock` (shut at once if the cut came first)."""
        with self._lock:
            if self._done:
                return
            self._socket = sock
            cut = self._cut
        if cut:
            sock.shut()

    def cut(self) -> None:
        """Shut down the request's connection (if it still runs)."""
        with self._lock:
            if self._done or self._cut:
                return
            self._cut, sock = True, self._socket
        if sock is not None:
            sock.shut()

    def done(self) -> None:
        """The request ended: a later `cut` leaves its (pooled) connection alone."""
        with self._lock:
            self._done, self._socket = True, None


@contextlib.contextmanager
def cuttable(cut: Cut) -> Iterator[None]:
    """Attach every stream this thread touches in the block to `cut`."""
    _current.cut = cut
    try:
        yield
    finally:
        _current.cut = None
        cut.done()


def install(client: httpx.Client) -> bool:
    """Make the client's requests cuttable; False if its transports have no pool to wrap."""
    installed = False
    for pool in pool_guard.pools(client):
        inner = getattr(pool, "_network_backend", None)
        if inner is not None and not isinstance(inner, _Backend):
            pool._network_backend = _Backend(inner)
            installed = True
    return installed


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _attach(self) -> None:
        cut: Cut | None = getattr(_current, "cut", None)
        if cut is not None:
            cut.attach(Socket(self._inner.get_extra_info("socket")))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._attach()
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._attach()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        inner = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        stream = _Stream(inner)
        stream._attach()
        return stream

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        stream = _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))
        stream._attach()
        return stream

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
