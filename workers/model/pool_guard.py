"""Keep httpcore's connection pool from closing a connection it has just given a request.

httpcore 1.0.9 (encode/httpcore#1110, its fix #1111 open and unreleased) hands an idle
connection to a waiting request under its lock, but the connection stays idle until that
request's thread runs again and starts on it. Another thread's pass over the pool in
between still sees it idle, and closes it if its keep-alive expired (or it is surplus, or
room is needed): outside the lock, so often just after the request started on it. The
request then reads a closed socket: `[Errno 9] Bad file descriptor`, or, if the number was
given to another file meanwhile, that file. Under load (hundreds of threads waiting for the
GIL, the fleet regime of BENCHMARKS.md) the gap is long enough to hit: 2-3 requests of
13,334 at pool 512.

`guard` makes the pool's pass leave alone every connection a pending request holds (they
are not the pass's to close or to give again, and they count against the connection cap),
then does what httpcore does with the rest. httpcore is pinned; the test that drives the
pass proves the guard still holds on an upgrade. Since each thread of a worker sends on a
pool of its own (workers/model/client.py), the race needs a pool that threads share (a client
passed in); the guard stays on every pool, where it costs a walk of one connection.
"""

from __future__ import annotations

import types
from typing import Any

import httpcore
import httpx

_PASS = httpcore.ConnectionPool._assign_requests_to_connections  # private: see above


def pools(client: httpx.Client) -> list[httpcore.ConnectionPool]:
    """The httpcore pools of `client`'s transports (httpx has no public way to them)."""
    transports = [client._transport, *client._mounts.values()]  # private: see above
    found = (getattr(t, "_pool", None) for t in transports)
    return [pool for pool in found if isinstance(pool, httpcore.ConnectionPool)]


def guard(client: httpx.Client) -> bool:
    """Guard the pools of `client`'s transports; False if it has no pool to guard."""
    found = pools(client)
    for pool in found:
        pool._assign_requests_to_connections = types.MethodType(_guarded_pass, pool)  # type: ignore[method-assign]
    return bool(found)


def _guarded_pass(pool: httpcore.ConnectionPool) -> list[Any]:
    """httpcore's pass over the pool, blind to the connections pending requests hold."""
    given = {id(r.connection) for r in pool._requests if r.connection is not None}
    held = [c for c in pool._connections if id(c) in given]
    if not held:
        return _PASS(pool)  # type: ignore[no-any-return]
    cap = pool._max_connections
    pool._connections = [c for c in pool._connections if id(c) not in given]
    pool._max_connections = cap - len(held)
    try:
        return _PASS(pool)  # type: ignore[no-any-return]
    finally:
        pool._connections = held + pool._connections
        pool._max_connections = cap
