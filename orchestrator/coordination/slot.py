"""A slot of a fan-out runs its tickets in a row, not one Celery message each.

A per-ticket task holds one of its fan-out's `pool_size` slots. When its ticket is done the
fan-out hands the slot the next ticket (coordination/fanout.py `advance`); the task runs that ticket
itself, and the next, while the slot's `Row` allows it (at most MAX_TICKETS tickets or
MAX_S seconds for one message, and never once its worker is shutting down); past that it
sends the next ticket a message as before. A message costs a worker more CPU than a ticket
at latency 0: receiving, acknowledging and tracing it, and publishing the next one, were
about a third of a worker's CPU (BENCHMARKS.md, #21).

What does not change: every ticket is held for the task's delivery (by `hold`, or by the
handoff that gave it to the row, in the same round trip) and fenced by its own epoch; a
task redelivered after its worker died (same delivery id) walks the same handoffs again
(each `advance` answers as it did, and holds the same ticket for it) and takes up the
ticket the dead copy was on; a duplicate message steps aside. The bound lets a slot move
between worker processes at each message, so a worker started mid-run gets its share, and
a stopping worker sends the ticket on instead of running it (letting go of its hold).

Flower shows each ticket run in a row as a task of its own — received, started, succeeded
under an id made from the delivery and the ticket — when the worker sends task events (a
monitor asked for them); otherwise a row costs nothing more.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

from celery.worker import state as worker_state

MAX_TICKETS = 100  # tickets one message runs at most, in a row
MAX_S = 10.0  # seconds after which a row hands its slot on by message

_ROW_IDS = uuid.UUID("6f1c2a4e-9b7d-4c53-8e21-5d0a7b3c9f18")  # the namespace of a row's ids
_consumers: list[Any] = []  # this process's Celery consumer, once it is ready


def attach(consumer: Any) -> None:
    """Remember this worker process's consumer: its event dispatcher shows rows in Flower."""
    _consumers[:] = [consumer]


class Row:
    """The tickets one delivery of a per-ticket task runs, one after another."""

    def __init__(self, delivery: str, task: str) -> None:
        self.delivery, self.task = delivery, task
        self.started = time.monotonic()
        self.count = 0  # tickets run so far
        self.next: str | None = None  # the ticket handed to this slot, to run now

    def may_run_more(self) -> bool:
        """Whether the slot's next ticket runs here (else it gets a message of its own)."""
        stopping = worker_state.should_stop is not None or worker_state.should_terminate
        return self.count < MAX_TICKETS and time.monotonic() - self.started < MAX_S and not stopping

    def take_next(self) -> str | None:
        """The ticket to run now (None: the row ends), counted."""
        ticket, self.next = self.next, None
        if ticket is not None:
            self.count += 1
        return ticket

    @contextlib.contextmanager
    def shown(self, args: list[str]) -> Iterator[dict[str, Any]]:
        """Run one ticket of the row as Flower's own task (events sent only if enabled);
        the block fills the dict it gets with the summary Flower shows as the result."""
        summary: dict[str, Any] = {}
        dispatcher = _task_events()
        if dispatcher is None:
            yield summary
            return
        row_id = str(uuid.uuid5(_ROW_IDS, f"{self.delivery}/{args[-1]}"))
        shown = repr(args)
        dispatcher.send(
            "task-received",
            uuid=row_id,
            name=self.task,
            args=shown,
            kwargs="{}",
            root_id=self.delivery,
            parent_id=self.delivery,
            retries=0,
            eta=None,
            expires=None,
        )
        dispatcher.send("task-started", uuid=row_id)
        began = time.monotonic()
        try:
            yield summary
        except BaseException as exc:
            dispatcher.send("task-failed", uuid=row_id, exception=repr(exc), traceback="")
            raise
        dispatcher.send(
            "task-succeeded", uuid=row_id, result=repr(summary), runtime=time.monotonic() - began
        )


def _task_events() -> Any:
    """The consumer's event dispatcher if it sends task events now, else None."""
    consumer = _consumers[0] if _consumers else None
    dispatcher = getattr(consumer, "event_dispatcher", None)
    if dispatcher is None or not dispatcher.enabled:
        return None
    groups = dispatcher.groups
    return dispatcher if not groups or "task" in groups else None
