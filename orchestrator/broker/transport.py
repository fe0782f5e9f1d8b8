"""kombu's Redis transport, reusing one client per channel for what it sends.

Stock kombu builds a new `redis.Redis` object for every message it publishes, every event
and every acknowledgement (`Channel._create_client`); with redis-py 8 that costs about
0.3 ms of CPU each, a tenth of a worker's CPU in a 1,000-ticket run. A `redis.Redis` is
safe to share between threads (each command checks a connection out of the pool), so
one per channel serves every publish. Polling keeps its own client, as before.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from kombu.transport import redis as kombu_redis
from kombu.utils.url import maybe_sanitize_url

TCP = "orchestrator.broker.transport:Transport"
SOCKET = "orchestrator.broker.transport:SocketTransport"


class Channel(kombu_redis.Channel):
    """A Redis channel whose synchronous client is built once."""

    _shared_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        """The polling client is new each time (as stock); the publishing one is shared."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        if self._shared_client is None:
            self._shared_client = super()._create_client(asynchronous=False)
        return self._shared_client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel


class SocketTransport(Transport):
    """The same over a unix socket: kombu hands the `socket://` URL to the channel unparsed
    (as it does for `redis+socket://`), and the channel reads the path and query."""

    can_parse_url = True


# The broker URLs ticketgraph works with: Redis over TCP, over TLS, or over a unix socket.
SCHEMES = ("redis", "rediss", "unix", "redis+socket")


def broker_url_problem(broker_url: str) -> str | None:
    """Why `broker_url` cannot be ticketgraph's broker (a phrase to follow the URL), or
    None if it can. Every way in (the environment, --broker, Celery's own flag) asks here."""
    parts = urlsplit(broker_url)
    if parts.scheme not in SCHEMES:
        return (
            "not a Redis URL (use redis://HOST:PORT/DB, rediss:// for TLS, or "
            "unix:///path/to/redis.sock)"
        )
    if parts.scheme in ("unix", "redis+socket") and not parts.path:
        return "names no socket path (e.g. unix:///run/redis/redis.sock)"
    return None


def shown(broker_url: str) -> str:
    """The URL with its password masked, for messages."""
    return str(maybe_sanitize_url(broker_url))


def connection_args(broker_url: str) -> tuple[str, str | None]:
    """(URL, transport) for Celery: Redis URLs get this transport, `rediss://` stock kombu's.

    `redis+socket:///path` and `unix:///path?db=N` become `socket:///path`, the form
    kombu's Redis channel reads when the transport is named explicitly rather than by the
    URL's scheme (the database as `virtual_host`).
    """
    if broker_url.startswith("redis+socket://"):
        return "socket://" + broker_url[len("redis+socket://") :], SOCKET
    if broker_url.startswith("unix://"):
        parts = urlsplit(broker_url)
        db = parse_qs(parts.query).get("db", ["0"])[0]
        return f"socket://{parts.path}?virtual_host={db}", SOCKET
    if broker_url.startswith("redis://"):
        return broker_url, TCP
    return broker_url, None
