"""Which broker URLs ticketgraph takes, and how they are shown in messages.

The configuration checks a URL before anything connects (the environment, --broker,
Celery's own flag), so these live with the configuration; the broker's transport
(broker/transport.py) turns an accepted URL into what kombu needs.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from kombu.utils.url import maybe_sanitize_url

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
