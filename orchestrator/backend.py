"""Celery's Redis result backend, minus the result subscriptions.

Stock Celery subscribes (Redis pub/sub) to every task it sends, in every thread, and keeps
that subscription until the result object is garbage collected — for chord parts, at
interpreter exit, after an embedded Redis has stopped, where each then retries a dead server.
ticketgraph never blocks on a Celery result (it watches run-state.json), and chords join
through Redis counters, not pub/sub, so sending a task subscribes to nothing here.
"""

from __future__ import annotations

from typing import Any

from celery.backends.redis import RedisBackend


class UnsubscribedRedisBackend(RedisBackend):
    """Stores results (chords need them) and reads them on demand; never subscribes.

    A result's state can be polled (`.state`, `.failed()`); `.get()` would wait forever.
    """

    def on_task_call(self, producer: Any, task_id: str) -> None:
        """Sending a task: stock Redis subscribes to its result here; we do not."""

    def add_pending_result(
        self, result: Any, weak: bool = False, start_drainer: bool = True
    ) -> Any:
        """Sending a group: stock Celery waits on each part here; chords use counters instead."""
        return result

    def remove_pending_result(self, result: Any) -> Any:
        """Nothing was pending, so there is nothing to unsubscribe."""
        return result


def backend_url(redis_url: str) -> str:
    """The `result_backend` setting that selects this backend for a redis:// or socket URL."""
    scheme, _, rest = redis_url.partition("://")
    transport = "socket" if scheme == "redis+socket" else scheme
    return f"orchestrator.backend:UnsubscribedRedisBackend+{transport}://{rest}"
