"""One live owner per run: a lease file in the run folder.

The command that runs or resumes a run holds `runs/<id>/lease.json` (its host, PID and the
PID's start time, so a reused PID is not mistaken for it) and renews it while it waits;
worker tasks of a distributed run touch it as they finish tickets. The lease is live while

- its holder is a process on this host that still exists, or
- it was renewed or touched within TTL_S (a holder on another host; or a distributed run
  whose command died while its workers go on) and the run is not finished: nobody works on
  a finished run, so `resume` of one reports its verdict at once.

An embedded run's workers die with its command, so there only the holder counts: `resume`
right after a `kill -9` takes over at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from orchestrator import process
from orchestrator.errors import RunBusy, RunStateError
from orchestrator.run.records import RunStatus
from orchestrator.run.store import RunStore
from workers import atomic

LEASE_FILE = "lease.json"
TTL_S = 30.0
RENEW_EVERY_S = 5.0

Mode = Literal["embedded", "distributed"]


class Holder(BaseModel):
    """Who holds a run's lease."""

    host: str
    pid: int
    pid_started: str
    mode: Mode


def path(store: RunStore) -> Path:
    """The run's lease file."""
    return store.dir / LEASE_FILE


def holder(store: RunStore) -> Holder | None:
    """The live holder of the run's lease, or None if nobody holds it."""
    lease = path(store)
    try:
        current = Holder.model_validate_json(lease.read_bytes())
        age = time.time() - lease.stat().st_mtime
    except (FileNotFoundError, ValidationError, ValueError):
        return None
    if current.host == socket.gethostname() and process.alive(current.pid, current.pid_started):
        return current
    recent = age < TTL_S and (current.host != socket.gethostname() or current.mode == "distributed")
    return current if recent and not _finished(store) else None


def _finished(store: RunStore) -> bool:
    try:
        return store.meta().status is RunStatus.DONE
    except RunStateError:
        return False


class Lease:
    """A held lease: renew it while the run goes on, release it when done."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.renewed = time.monotonic()

    def renew(self) -> None:
        """Mark the holder alive (at most one write per RENEW_EVERY_S)."""
        if time.monotonic() - self.renewed >= RENEW_EVERY_S:
            touch(self.store)
            self.renewed = time.monotonic()

    def release(self) -> None:
        """Give the lease up (if the run folder can no longer be written, it lapses alone)."""
        with contextlib.suppress(OSError):
            path(self.store).unlink()


def acquire(store: RunStore, mode: Mode) -> Lease:
    """Take the run's lease; `RunBusy` naming the holder if another process holds it."""
    current = holder(store)
    if current is not None and not is_me(current):
        raise RunBusy(busy_message(store, current))
    me = Holder(
        host=socket.gethostname(),
        pid=os.getpid(),
        pid_started=process.started(os.getpid()),
        mode=mode,
    )
    atomic.write_text(path(store), me.model_dump_json())
    return Lease(store)


def is_me(current: Holder) -> bool:
    """True if this process holds the lease."""
    return (current.host, current.pid) == (socket.gethostname(), os.getpid())


def touch(store: RunStore) -> None:
    """Progress of the run: renew its lease's time, if it has one.

    At most once per RENEW_EVERY_S per process: a utime is a journaled metadata change, and
    one per finished ticket queued behind every fsync of the run (2 s of system time in a
    1,000-ticket run).
    """
    lease_file = path(store)
    now = time.monotonic()
    if now - _touched.get(lease_file, -RENEW_EVERY_S) < RENEW_EVERY_S:
        return
    _touched[lease_file] = now
    with contextlib.suppress(FileNotFoundError):
        os.utime(lease_file)


_touched: dict[Path, float] = {}  # lease file -> when this process last touched it


def busy_message(store: RunStore, current: Holder) -> str:
    """One sentence saying who works on the run and what to do."""
    return (
        f"run {store.run_id} is being worked on by PID {current.pid} on {current.host} "
        f"({current.mode}); try again later, or `ticketgraph resume {store.run_id} --wait`"
    )


def wait_free(store: RunStore, wait: bool, say: Callable[[str], None] = print) -> None:
    """Return once nobody else works on the run; `RunBusy` at once unless `wait` (then say
    once who holds it, and look again every second)."""
    told = False
    while (current := holder(store)) is not None and not is_me(current):
        if not wait:
            raise RunBusy(busy_message(store, current))
        if not told:
            say(f"waiting: {busy_message(store, current)}")
            told = True
        time.sleep(1.0)  # another process's liveness: nothing to block on but time
