"""The worker's pool: Celery's threads pool, waking the consumer's loop when a task is done.

With `worker_disable_prefetch` a worker stops asking Redis for messages while every thread
is busy, and asks again only when its event loop next runs. Celery's task events woke that
loop by chance (the task-succeeded event is sent from the thread right after the task's slot
is freed); without them the loop slept until its next timer, up to a second, with threads
idle and tickets waiting. Here the thread that finished a task wakes the loop itself, so a
freed thread takes the next message at once, whether events are on or off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.concurrency.thread import ApplyResult
from celery.concurrency.thread import TaskPool as ThreadsPool
from kombu.asynchronous import get_event_loop


class TaskPool(ThreadsPool):
    """Celery's threads pool whose finished tasks wake the consumer's event loop."""

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **rest: Any,
    ) -> ApplyResult:
        hub = get_event_loop()  # the consumer's loop: on_apply runs on its thread

        def done(*result: Any, **more: Any) -> None:
            try:
                if callback is not None:
                    callback(*result, **more)  # frees the task's slot and acknowledges it
            finally:
                if hub is not None:
                    hub.call_soon(_look_again)  # thread-safe: wakes the loop's poller

        return super().on_apply(target, args, kwargs, done, accept_callback, **rest)


def _look_again() -> None:
    """Nothing: running the loop once is the point (it asks Redis for the next message)."""
