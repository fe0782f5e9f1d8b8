"""kombu's Redis transport, reusing one client per channel for what it sends, and judging
unacknowledged messages on the broker's clock.

Stock kombu builds a new `redis.Redis` object for every message it publishes, every event
and every acknowledgement (`Channel._create_client`); with redis-py 8 that costs about
0.3 ms of CPU each, a tenth of a worker's CPU in a 1,000-ticket run. A `redis.Redis` is
safe to share between threads (each command checks a connection out of the pool), so
one per channel serves every publish. Polling keeps its own client, as before.

Stock kombu also stamps each message it delivers with the consumer's `time()` and brings
back those older than the visibility timeout by the restorer's `time()`: a worker whose
clock runs 120 s ahead brought back every live task of the others (issue 45: 4-6 tickets
a run taken twice). `QoS` below stamps and sweeps on Redis's `TIME` instead (clock.py).
"""

from __future__ import annotations

import logging
import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps
from kombu.utils.url import parse_url

from orchestrator.coordination.clock import NOW_S, script

log = logging.getLogger(__name__)

TCP = "orchestrator.broker.transport:Transport"
SOCKET = "orchestrator.broker.transport:SocketTransport"


# KEYS: kombu's unacked index and unacked hash; ARGV: the delivery tag, the message as kombu
# keeps it. What kombu's `QoS.append` writes, with the index scored on Redis's clock.
_HELD = (
    NOW_S
    + """
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
"""
)

# KEYS: the unacked index; ARGV: the visibility timeout (s), offset, count (0: all). The tags
# delivered (or last beaten, heartbeat.py) a timeout or more ago by Redis's clock, newest
# first as kombu's sweep takes them.
_DUE = (
    NOW_S
    + """
local ceil = now - tonumber(ARGV[1])
if tonumber(ARGV[3]) > 0 then
  return redis.call('ZRANGE', KEYS[1], ceil, 0, 'BYSCORE', 'REV', 'LIMIT', ARGV[2], ARGV[3])
end
return redis.call('ZRANGE', KEYS[1], ceil, 0, 'BYSCORE', 'REV')
"""
)


class QoS(kombu_redis.QoS):
    """kombu's acknowledgement emulation, its delivery stamps and its restore sweep on the
    broker's clock rather than this machine's."""

    def append(self, message: Any, delivery_tag: str) -> None:
        """Keep the delivered message in the unacked hash and index, as kombu does."""
        delivery = message.delivery_info
        kept = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            script(client, _HELD)(
                keys=[self.unacked_index_key, self.channel.unacked_key],
                args=[delivery_tag, kept],
            )
        virtual.QoS.append(self, message, delivery_tag)  # kombu's own, past its Redis write

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
        """Bring back the messages whose holder stopped beating, under kombu's restore lock;
        like kombu, only every `interval`th call looks."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        with self.channel.conn_or_acquire() as client:
            try:
                with kombu_redis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    for tag in self._due(client, start, num):
                        self.restore_by_tag(tag, client)
            except kombu_redis.MutexHeld:
                pass  # another worker is sweeping now

    def _due(self, client: Any, start: int, num: int) -> list[bytes]:
        args = [self.visibility_timeout, start if num else 0, num or 0]
        return list(script(client, _DUE)(keys=[self.unacked_index_key], args=args))


class Channel(kombu_redis.Channel):
    """A Redis channel whose synchronous client is built once, with `QoS` above."""

    QoS = QoS
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


def connection_args(broker_url: str) -> tuple[str, str]:
    """(URL, transport) for Celery: every Redis URL gets this transport, so every worker
    judges held messages on the broker's clock (`rediss://` too: see `tls_options`).

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
    return broker_url, TCP


def tls_options(broker_url: str) -> dict[str, Any] | None:
    """Celery's `broker_use_ssl` for a `rediss://` URL without `ssl_*` options of its own.

    kombu turns TLS on for such a URL only when the URL's scheme names the transport; with
    ours named, it would speak plain TCP to a TLS port. So this gives what kombu gives then
    (no certificate check), with its warning; options in the URL still win, as in kombu.
    """
    if not broker_url.startswith("rediss://") or parse_url(broker_url).get("ssl"):
        return None
    log.warning(
        "Secure redis scheme specified (rediss) with no ssl options, defaulting to insecure "
        "SSL behaviour (add ?ssl_cert_reqs=required&ssl_ca_certs=... to the URL to check)."
    )
    return {"ssl_cert_reqs": ssl.CERT_NONE}
