"""Per-task time limits, enforced by the task itself.

Celery's soft and hard limits need its prefork pool; ticketgraph's workers run tasks on
threads (embedded and `ticketgraph worker` alike), where Celery ignores them. So each task
arms both here:

- at the soft limit the task's cancel token is set with reason `time_limit`: its agent stops
  at once, even mid-request or inside a tool, and the ticket stops with reason `time_limit`;
- at the hard limit, a task that is still running (it ignored the cancel) gets `on_hard`
  (record the verdict, hand the slot on) and then its whole worker process exits: a thread
  cannot be killed, and a stuck one must not write after its verdict. `ticketgraph worker`
  starts a new process in its place; the process's other messages come back to the queue.

One watchdog thread per process keeps every deadline (no thread per task).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from workers.cancel import CancelToken

log = logging.getLogger(__name__)

TIME_LIMIT = "time_limit"  # the cancel reason of a task that reached its soft limit
HARD_LIMIT_EXIT = 70  # EX_SOFTWARE: the supervisor restarts the process
COMPACT_AFTER = 256  # disarmed deadlines the heap may hold before it is rebuilt without them


@dataclass(order=True)
class _Deadline:
    when: float
    seq: int
    action: Callable[[], None] | None = field(compare=False)  # None once disarmed

    @property
    def armed(self) -> bool:
        return self.action is not None


class _Watchdog:
    """Deadlines of this process's tasks, fired by one thread in time order."""

    def __init__(self) -> None:
        self._heap: list[_Deadline] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._disarmed = 0  # disarmed deadlines still in the heap (at most)
        threading.Thread(target=self._run, name="tg-watchdog", daemon=True).start()

    def arm(self, after_s: float, action: Callable[[], None]) -> _Deadline:
        deadline = _Deadline(time.monotonic() + after_s, next(self._seq), action)
        with self._cv:
            heapq.heappush(self._heap, deadline)
            if self._heap[0] is deadline:  # it is due first: the thread sleeps too long now
                self._cv.notify()
        return deadline

    def disarm(self, deadline: _Deadline) -> None:
        """The task ended: drop its action at once (it holds the task's whole context), and
        the deadlines of ended tasks once they are most of the heap. Left until their time
        came, a worker kept every ticket of the last hard limit's span: 505 MB at 10,000
        tickets (BENCHMARKS.md, section h)."""
        with self._cv:
            deadline.action = None
            self._disarmed += 1
            if self._disarmed > max(COMPACT_AFTER, len(self._heap) // 2):
                self._heap = [d for d in self._heap if d.armed]
                heapq.heapify(self._heap)
                self._disarmed = 0

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0].when > time.monotonic():
                    wait = self._heap[0].when - time.monotonic() if self._heap else None
                    self._cv.wait(wait)
                due = heapq.heappop(self._heap)
                action = due.action
                if action is None:
                    self._disarmed = max(self._disarmed - 1, 0)
            if action is not None:
                try:
                    action()
                except Exception:
                    log.exception("time limit action failed")


_watchdogs: dict[int, _Watchdog] = {}
_lock = threading.Lock()


def _watchdog() -> _Watchdog:
    with _lock:
        dog = _watchdogs.get(os.getpid())
        if dog is None:
            dog = _watchdogs[os.getpid()] = _Watchdog()
        return dog


@contextlib.contextmanager
def enforced(
    cancel: CancelToken, soft_s: float, hard_s: float, on_hard: Callable[[], None], what: str
) -> Iterator[None]:
    """Run the body under both limits (a limit of 0 is off)."""
    dog = _watchdog()
    armed: list[_Deadline] = []
    if soft_s > 0:
        armed.append(dog.arm(soft_s, lambda: _soft(cancel, soft_s, what)))
    if hard_s > 0:
        armed.append(dog.arm(hard_s, lambda: _hard(on_hard, hard_s, what)))
    try:
        yield
    finally:
        for deadline in armed:
            dog.disarm(deadline)


def _soft(cancel: CancelToken, soft_s: float, what: str) -> None:
    log.warning("%s reached its soft time limit (%s s): cancelling it", what, soft_s)
    cancel.cancel(TIME_LIMIT)


def _hard(on_hard: Callable[[], None], hard_s: float, what: str) -> None:
    log.critical(
        "%s still running at its hard time limit (%s s): replacing the process", what, hard_s
    )
    try:
        on_hard()
    finally:
        logging.shutdown()
        os._exit(HARD_LIMIT_EXIT)
