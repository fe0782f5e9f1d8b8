"""What the web view lists — the workspace's runs and each run's tickets — read from the run
folders (the same files `status` and `runs` read) and kept in this process by each file's
modification time and size, so a page costs a directory scan plus the files that changed.

A run that has ended is read from two files: run.json (its totals, RunTotals) and, for its
tickets, the materialised run-state.json. A live run is read from its records/, one file per
ticket, re-read only when it changed. The catalog is shared by the server's threads: one lock
per run folder, held while a folder is scanned.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic_core import from_json

from orchestrator.config.workspace import Workspace
from orchestrator.errors import RunStateError
from orchestrator.run import ids
from orchestrator.run.records import Routed, TicketStatus, spent, ticket_spend
from orchestrator.run.store import META_FILE, ROUTE_NODE, STATE_FILE, RunStore
from orchestrator.submission.status import seconds_between, verdict_of
from orchestrator.web import live
from workers import versions

HUMAN = TicketStatus.NEEDS_HUMAN.value
WAITING = TicketStatus.AWAITING_APPROVAL.value
CLAIMED = TicketStatus.CLAIMED.value
RUNNING = "running"
LIVE_TTL_S = 0.5  # a live run's view is reused this long (its page refreshes every 1 s)


class TicketRow(NamedTuple):
    """One line of a run's tickets table (a tuple: 10,000 of them are built per read)."""

    id: str
    category: str
    handler: str
    rounds: int
    stop: str
    status: str
    cost_usd: float
    routing: str
    calls: int
    tokens: int
    # What a step of a live run is doing with it now (`drafting`, `in review`; "" when no
    # step is): shown instead of `status`, which stays the record's (counts and filters).
    at_work: str = ""

    @property
    def shown_status(self) -> str:
        """The status its row shows: what a step does with it now, else its record's."""
        return self.at_work or self.status


@dataclass(frozen=True)
class RunRow:
    """One line of the runs table."""

    run_id: str
    started_at: str
    status: str  # running, stopped_early, crashed, done, or unreadable
    verdict: str
    exit_code: int | None
    tickets: int
    by_status: dict[str, int]
    calls: int
    tokens: int
    cost_usd: float
    budget_usd: float | None
    duration_s: float | None
    cancelled: bool
    error: str | None = None

    @property
    def live(self) -> bool:
        """True while the run works."""
        return self.status == RUNNING

    @property
    def need_a_human(self) -> int:
        """Tickets that ended needs_human."""
        return self.by_status.get(HUMAN, 0)

    @property
    def waiting(self) -> int:
        """Tickets whose worker waits for a person's decision."""
        return self.by_status.get(WAITING, 0)


@dataclass(frozen=True)
class RunView:
    """One run as its page shows it."""

    row: RunRow
    meta: dict[str, Any]
    tickets: list[TicketRow]
    nodes: dict[str, dict[str, Any]]


@dataclass
class _Folder:
    """What the catalog holds of one run folder."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    meta_key: tuple[int, int, int] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    row: RunRow | None = None
    row_key: tuple[Any, ...] | None = None
    # Tickets of a live run: record file name -> ((mtime_ns, size), row).
    records: dict[str, tuple[tuple[int, int, int], TicketRow]] = field(default_factory=dict)
    # Tickets of an ended run, read from run-state.json, and that file's key.
    ended: list[TicketRow] | None = None
    ended_key: tuple[int, int, int] | None = None
    nodes_key: tuple[Any, ...] | None = None
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # route's decisions (routes.json, as RunStore keeps them), shown in records drafting
    # has not written yet
    routes: Mapping[str, Routed] = field(default_factory=dict)
    # Agent states of a live run's tickets still at work: file name -> (its key, what it
    # paid), re-read only when it changed (live.py).
    agents: dict[str, tuple[tuple[int, int, int], live.Paid]] = field(default_factory=dict)
    last: RunView | None = None  # the last view computed, and when (time.monotonic())
    last_at: float = 0.0
    last_meta: tuple[int, int, int] | None = None  # run.json's version that view was made from


class Catalog:
    """The runs of one workspace, read from disk and cached by file times."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.runs_dir = workspace.runs
        self._folders: dict[str, _Folder] = {}
        self._lock = threading.Lock()

    def run_ids(self) -> list[str]:
        """Every run id of the workspace (folders with a run.json), newest first."""
        try:
            names = [e.name for e in os.scandir(self.runs_dir) if e.is_dir()]
        except FileNotFoundError:
            return []
        return sorted((n for n in names if ids.is_run_id(n)), reverse=True)

    def runs(self) -> list[RunRow]:
        """Every run's row, newest first (a run whose files cannot be read: `unreadable`)."""
        rows = (self.run(run_id) for run_id in self.run_ids())
        return [row for row in rows if row is not None]

    def run(self, run_id: str) -> RunRow | None:
        """One run's row; None if there is no such run."""
        folder = self._folder(run_id)
        with folder.lock:
            if not self._read_meta(run_id, folder):
                self._forget(run_id)
                return None
            meta = folder.meta
            if meta.get("status") != RUNNING and meta.get("totals"):
                key: tuple[Any, ...] = ("ended", folder.meta_key)
                if folder.row is None or folder.row_key != key:
                    folder.row, folder.row_key = _row(run_id, meta, meta["totals"]), key
                return folder.row
            return self._computed(run_id, folder).row

    def view(self, run_id: str) -> RunView | None:
        """The run's row, run.json, tickets and nodes, read together; None if no such run."""
        folder = self._folder(run_id)
        with folder.lock:
            if not self._read_meta(run_id, folder):
                self._forget(run_id)
                return None
            return self._computed(run_id, folder)

    # --- reading -------------------------------------------------------------------------

    def _computed(self, run_id: str, folder: _Folder) -> RunView:
        """The run's view from its files; a live run's is reused for LIVE_TTL_S, so however
        many pages watch it, its records are scanned at most a few times a second."""
        now = time.monotonic()
        last = folder.last
        fresh = now - folder.last_at < LIVE_TTL_S and folder.last_meta == folder.meta_key
        if last is not None and last.row.live and fresh:
            return last
        tickets = self._tickets(run_id, folder)
        nodes = self._nodes(run_id, folder)
        meta = folder.meta
        if meta.get("status") == RUNNING:
            agents = self.runs_dir / run_id / "agents"
            tickets = live.at_work(agents, tickets, folder.agents)
        if meta.get("status") != RUNNING and meta.get("totals"):
            row = _row(run_id, meta, meta["totals"])
        else:
            by_status: dict[str, int] = {}
            for t in tickets:
                by_status[t.status] = by_status.get(t.status, 0) + 1
            figures = spent(
                nodes.values(),
                nodes.get(ROUTE_NODE) or _NONE,
                ((t.calls, t.tokens, t.cost_usd) for t in tickets),
            )
            totals = {"tickets": len(tickets), "by_status": by_status} | figures
            row = _row(run_id, meta, totals)
        folder.last, folder.last_at = RunView(row, meta, tickets, nodes), now
        folder.last_meta = folder.meta_key
        return folder.last

    def _folder(self, run_id: str) -> _Folder:
        ids.run(run_id)  # before any path is built from it
        with self._lock:
            return self._folders.setdefault(run_id, _Folder())

    def _forget(self, run_id: str) -> None:
        """Drop a run that is not there (made-up ids must not fill the catalog)."""
        with self._lock:
            self._folders.pop(run_id, None)

    def _read_meta(self, run_id: str, folder: _Folder) -> bool:
        path = self.runs_dir / run_id / META_FILE
        try:
            key = _key(path)
            if key != folder.meta_key:
                folder.meta, folder.meta_key = from_json(path.read_bytes()), key
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            folder.meta, folder.meta_key = {"status": "unreadable", "error": str(exc)}, None
        return True

    def _tickets(self, run_id: str, folder: _Folder) -> list[TicketRow]:
        run_dir = self.runs_dir / run_id
        if folder.meta.get("status") != RUNNING:
            state = run_dir / STATE_FILE
            try:
                key = _key(state)
                if key == folder.ended_key and folder.ended is not None:
                    return folder.ended
                # Materialised after it ended, and no record written since (every write is a
                # rename or an append, and both move the folder's time): else the records are
                # the truth.
                ended_at = (folder.meta_key or (0,))[0]
                records_at = (run_dir / "records").stat().st_mtime_ns
                if key[0] >= ended_at and key[0] >= records_at:
                    doc = from_json(state.read_bytes())
                    tickets = doc.get("tickets") or {}
                    rows = [_ticket_row(i, t) for i, t in sorted(tickets.items())]
                    folder.ended, folder.ended_key = rows, key
                    folder.records.clear()
                    return rows
            except (OSError, ValueError, AttributeError):
                pass  # read the records instead
        folder.ended = folder.ended_key = None
        return self._records(run_dir, folder)

    def _records(self, run_dir: Path, folder: _Folder) -> list[TicketRow]:
        self._routes(run_dir, folder)
        seen: dict[str, tuple[tuple[int, int, int], TicketRow]] = {}
        try:
            entries = list(os.scandir(run_dir / "records"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            name = entry.name
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                known = folder.records.get(name)
                if known is not None:  # unchanged since the last look: one stat, no read
                    stat = entry.stat()
                    if known[0] == _version(stat):
                        seen[name] = known
                        continue
                # A record not seen yet (all of them, on a first view): its version from
                # the open descriptor, not a lookup of its path more.
                key, data = _read_keyed(entry.path)
                ticket_id = name[: -len(".json")]
                record = versions.newest(data, from_json)
                if record.get("status") == CLAIMED and ticket_id in folder.routes:
                    record |= folder.routes[ticket_id].shown()  # as RunStore shows it
                seen[name] = (key, _ticket_row(ticket_id, record))
            except (OSError, ValueError, AttributeError):
                known = folder.records.get(name)
                if known is not None:  # mid-replace or unreadable for a moment: keep the last
                    seen[name] = known
        folder.records = seen
        return sorted((row for _, row in seen.values()), key=lambda r: r.id)

    def _routes(self, run_dir: Path, folder: _Folder) -> None:
        """Keep route's decisions current (RunStore parses each version of the file once a
        process); when they change, the rows made without them are made again."""
        try:
            routes = RunStore(run_dir).routes()
        except (OSError, RunStateError):
            return  # unreadable for a moment: the next look reads it
        if routes is not folder.routes:
            folder.routes = routes
            folder.records.clear()

    def _nodes(self, run_id: str, folder: _Folder) -> dict[str, dict[str, Any]]:
        node_dir = self.runs_dir / run_id / "nodes"
        try:
            entries = sorted(
                (e.name, _key(Path(e.path))) for e in os.scandir(node_dir) if _is_json(e.name)
            )
        except FileNotFoundError:
            return {}
        key = tuple(entries)
        if key != folder.nodes_key:
            nodes = {}
            for name, _ in entries:
                try:
                    nodes[name[: -len(".json")]] = from_json((node_dir / name).read_bytes())
                except (OSError, ValueError):
                    continue
            folder.nodes, folder.nodes_key = nodes, key
        return folder.nodes


def _read_keyed(path: str) -> tuple[tuple[int, int, int], bytes]:
    """The file at `path`, whole, and its version (`_version`) as it was opened."""
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = os.fstat(fd)
        return _version(stat), _read_fd(fd, stat.st_size)
    finally:
        os.close(fd)


def _read_fd(fd: int, size: int) -> bytes:
    """The whole file open at `fd`, `size` the length it was seen with: one read when it
    still is (a live page's first view reads 10,000 records; pathlib and Python's file
    objects cost as much as the reads), else until its end: it grew since, or the file
    system returned less than asked (NFS, FUSE)."""
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    chunks = [data]
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _key(path: Path) -> tuple[int, int, int]:
    """A file's version: every write of a run file is a rename of a new file (a new inode)
    or an append (a new size and time)."""
    return _version(path.stat())


def _version(stat: os.stat_result) -> tuple[int, int, int]:
    """A file's version from its stat (see `_key`)."""
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


def _is_json(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def _ticket_row(ticket_id: str, record: dict[str, Any]) -> TicketRow:
    get = record.get
    used = ticket_spend(record)
    cost, calls, tokens = used.cost_usd, used.calls, used.tokens
    return TicketRow(
        ticket_id,
        get("category") or "-",
        get("handler") or "-",
        get("gate_rounds") or 0,
        get("stop") or "-",
        get("status") or "claimed",
        round(cost, 8),
        get("routing") or "-",
        calls,
        tokens,
    )


_NONE: dict[str, Any] = {}


def _row(run_id: str, meta: dict[str, Any], totals: dict[str, Any]) -> RunRow:
    status = str(meta.get("status") or "unreadable")
    exit_code = meta.get("exit_code")
    config = meta.get("config") or {}
    started, updated = meta.get("started_at") or "", meta.get("updated_at") or ""
    ended = None if status == RUNNING else updated
    return RunRow(
        run_id=run_id,
        started_at=started,
        status=status,
        verdict="crashed" if status == "unreadable" else verdict_of(status, exit_code),
        exit_code=exit_code,
        tickets=int(totals.get("tickets", 0)),
        by_status=dict(totals.get("by_status") or {}),
        calls=int(totals.get("calls", 0)),
        tokens=int(totals.get("tokens", 0)),
        cost_usd=float(totals.get("cost_usd", 0.0)),
        budget_usd=config.get("run_budget_usd"),
        duration_s=seconds_between(started, ended),
        cancelled=meta.get("cancel") is not None,
        error=meta.get("error"),
    )
