"""Leases held while a model call is in flight, pushed forward by one thread per process.

A budget hold (coordination/budget.py) and a slot of an endpoint's cap
(coordination/ratecap.py) each live in Redis under a lease that ends unless its holder
renews it: a SIGKILLed worker's money and slots come back when their leases end. Every
process renews what it holds every quarter of the lease, in one call per group (a ledger,
a cap). The lease's length is the graph's setting TICKETGRAPH_LEASE_S, given to `configure`
by the Celery app's configuration in every process that may hold one.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable

import redis

from orchestrator.coordination import clock

log = logging.getLogger(__name__)

# What a dead holder held is back this long after its last renewal, unless configured.
DEFAULT_LEASE_S = 20.0


class Renewer:
    """Renews the leases this process holds until they are dropped."""

    lease_s = DEFAULT_LEASE_S  # every holder renews at a quarter of it

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, tuple[Callable[[list[str]], None], set[str]]] = {}
        self._pid: int | None = None

    def add(self, group: Hashable, renew: Callable[[list[str]], None], lease_id: str) -> None:
        """Keep `lease_id` of `group` alive (`renew(ids)` pushes a group's leases forward)."""
        with self._lock:
            if self._pid != os.getpid():  # a fork: the parent's thread and leases are not ours
                self._held, self._pid = {}, os.getpid()
                threading.Thread(target=self._loop, name="tg-leases", daemon=True).start()
            self._held.setdefault(group, (renew, set()))[1].add(lease_id)

    def drop(self, group: Hashable, lease_id: str) -> None:
        """Stop renewing `lease_id` (its call ended)."""
        with self._lock:
            entry = self._held.get(group)
            if entry is not None:
                entry[1].discard(lease_id)

    def _loop(self) -> None:
        while True:
            time.sleep(self.lease_s / 4)
            with self._lock:
                work = [(renew, list(ids)) for renew, ids in self._held.values() if ids]
                self._held = {k: v for k, v in self._held.items() if v[1]}
            for renew, ids in work:
                try:
                    renew(ids)
                except redis.RedisError as exc:
                    log.warning("cannot renew %d leases (%s)", len(ids), exc)


renewer = Renewer()

# Lua: `now`, Redis's own clock in ms (every machine's leases are measured on one clock).
NOW_MS = clock.NOW_MS

# Lua: KEYS[1] a sorted set of lease id -> lease end (ms); ARGV: lease ms, the ids to renew.
RENEW = (
    NOW_MS
    + """
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i]) end
return 1
"""
)


def configure(lease_s: float) -> None:
    """How long what a dead holder held outlives its last renewal, in this process."""
    renewer.lease_s = lease_s


def lease_ms() -> int:
    """The lease in ms, as the scripts take it."""
    return int(renewer.lease_s * 1000)
