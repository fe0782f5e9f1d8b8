"""Keep the messages a live worker holds from coming back to the queue.

kombu's Redis transport keeps each unacknowledged message in a sorted set scored by the time
it was delivered, and every worker brings back those older than the visibility timeout: that
is how the tickets of a worker that died (SIGKILL, power loss) are delivered again. With a
short timeout they come back within a minute, but so would a healthy task slower than the
timeout. So each worker process beats: every third of the timeout it moves the score of every
message it holds (running or waiting for a thread) to now. A live worker's messages never
expire; a dead worker's stop beating and come back one timeout later.

"Now" is Redis's clock, read in the script that writes the scores, as the delivery stamp and
the restore sweep read it (transport.py): a worker whose wall clock is off by minutes beats
as well as any other, and brings back nothing that is still held.

`ZADD XX` only updates members still in the set, so a beat never brings back a message that
was acknowledged or already restored in the meantime.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.worker import state as worker_state

from orchestrator.coordination import keys
from orchestrator.coordination.clock import NOW_S, script

log = logging.getLogger(__name__)

INDEX_KEY = "unacked_index"  # kombu's default `unacked_index_key`
# The Celery app's setting that holds the beat's period in seconds (0: no beat).
HEARTBEAT_CONF_KEY = "ticketgraph_heartbeat_s"

# KEYS: the unacked index; ARGV: the tags this process holds. Returns how many were there.
_BEAT = (
    NOW_S
    + """
local moved = 0
for i = 1, #ARGV do moved = moved + redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[i]) end
return moved
"""
)

_stop = threading.Event()
_started_in: set[int] = set()  # pids: the consumer is "ready" again after each reconnect


def held_tags() -> list[str]:
    """Delivery tags of every message this worker process holds (reserved or running)."""
    tags = []
    for request in tuple(worker_state.reserved_requests):
        message = getattr(request, "message", None)
        tag = getattr(message, "delivery_tag", None)
        if tag:
            tags.append(tag)
    return tags


def beat(r: Any, tags: list[str], conf: Any) -> int:
    """Move `tags` to Redis's now in the unacked index named by the Celery app's `conf`;
    return how many were still there."""
    if not tags:
        return 0
    index = conf.broker_transport_options.get("unacked_index_key", INDEX_KEY)
    return int(script(r, _BEAT)(keys=[index], args=tags))


def _loop(conf: Any, every_s: float) -> None:
    r = keys.client(conf.broker_url)
    while not _stop.wait(every_s):
        try:
            beat(r, held_tags(), conf)
        except Exception as exc:  # the broker may be away: the next beat tries again
            log.warning("heartbeat missed: %s", exc)


def start(conf: Any) -> None:
    """Start this worker process's heartbeat once its consumer is ready (again, after a
    reconnect: then it is already running, and nothing changes). `conf`: the worker's Celery
    app's configuration (the broker, the unacked index, HEARTBEAT_CONF_KEY's period); it is
    passed in because coordination sits below the broker's app."""
    every = float(conf.get(HEARTBEAT_CONF_KEY) or 0)
    if every > 0 and os.getpid() not in _started_in:
        _started_in.add(os.getpid())
        _stop.clear()
        threading.Thread(target=_loop, args=(conf, every), name="tg-heartbeat", daemon=True).start()


def stop() -> None:
    """Stop the heartbeat (the worker is shutting down)."""
    _stop.set()
