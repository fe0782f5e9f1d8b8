"""The queue page's items (people/queue.py's), kept in this process per run folder by the
versions of the files they are read from, so a page costs a directory scan plus the runs
that changed: a queue of 10,000 items is read once, not at every request.

A run's items are read again when run.json, or any folder a person's or a worker's act
writes into (records/, handled/, audits/, approvals/, decisions/, void/), changed: every
file of a run is written by a rename or appended to as a file of versions
(workers/versions.py), and either changes its folder's time. They are read again at
least every `MAX_AGE_S` too, as a call's state moves from waiting to expired by the clock
alone. Ages are counted at each request from when each item began to wait.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.people import queue
from orchestrator.run import approvals
from orchestrator.run.store import META_FILE
from orchestrator.run.verdicts import AUDITS, HANDLED

MAX_AGE_S = 30.0
WATCHED = (META_FILE, "records", HANDLED, AUDITS, approvals.REQUESTS, approvals.DECISIONS)
WATCHED += (approvals.VOID,)

Key = tuple[tuple[int, int] | None, ...]


class Waiting:
    """Every run's items, by run id, with the key they were read under."""

    def __init__(self, workspace: Workspace) -> None:
        self.runs_dir = workspace.runs
        self.lock = threading.Lock()
        # Each item with when it began to wait (seconds since the epoch), to age it quickly.
        self.kept: dict[str, tuple[Key, float, list[tuple[float, queue.Item]]]] = {}

    def items(self, run_id: str | None = None) -> list[queue.Item]:
        """What waits for a person (in `run_id`, or every run), oldest first, ages as of now:
        copies, so a request's ages are its own."""
        names = [run_id] if run_id else _runs(self.runs_dir)
        found: list[tuple[float, queue.Item]] = []
        for name in names:
            found += self._of(name)
        now = time.time()
        aged = [item.aged(round(now - since, 1)) for since, item in found]
        return sorted(aged, key=lambda i: (i.since, i.run_id, i.ticket))

    def _of(self, run_id: str) -> list[tuple[float, queue.Item]]:
        folder = self.runs_dir / run_id
        key = _key(folder)
        with self.lock:
            kept = self.kept.get(run_id)
        if kept is not None and kept[0] == key and time.monotonic() - kept[1] < MAX_AGE_S:
            return kept[2]
        found = queue.of_run(folder) if key[0] is not None else []
        read = [(_parse(item.since).timestamp(), item) for item in found]
        with self.lock:
            self.kept[run_id] = (key, time.monotonic(), read)
        return read


def _runs(runs_dir: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(runs_dir) if e.name.startswith("run-"))
    except FileNotFoundError:
        return []


def _key(folder: Path) -> Key:
    """The versions of the run's files the items are read from (None: not there)."""
    versions = []
    for name in WATCHED:
        try:
            stat = os.stat(f"{folder}/{name}")
        except OSError:
            versions.append(None)
            continue
        versions.append((stat.st_mtime_ns, stat.st_ino))
    return tuple(versions)


def _parse(stamp: str) -> datetime:
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
