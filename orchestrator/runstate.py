"""run-state.json: one run's nodes and tickets, updated by many workers without losing a record.

Every update is read-modify-write under an exclusive `flock` on the run's lock file, and the
write is atomic (temp file, fsync, rename), so a reader never sees half a file and two
workers never overwrite each other's ticket. The run folder must be on a volume all workers
share (same path on every machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ValidationError

from orchestrator.errors import RunStateError
from orchestrator.exit_codes import ExitCode
from workers import atomic
from workers.trace import Tracer, now_iso

STATE_FILE = "run-state.json"
TRACE_FILE = "run.jsonl"
REPORT_FILE = "report.txt"


class TicketStatus(StrEnum):
    """Where a ticket is in the graph."""

    CLAIMED = "claimed"
    ROUTED = "routed"
    DRAFTED = "drafted"
    PASS = "pass"
    NEEDS_HUMAN = "needs_human"


class RunPhase(StrEnum):
    """Where the run as a whole is."""

    RUNNING = "running"
    STOPPED = "stopped_early"
    DONE = "done"
    CRASHED = "crashed"


class NodeRecord(BaseModel):
    """Time, model calls and tokens of one node (per the seed's summary table)."""

    ms: int = 0
    calls: int = 0
    tokens: int = 0
    status: str = "running"
    rounds: int | None = None
    started: float | None = None  # epoch seconds, so any machine can close the node
    error: str | None = None


class StepUsage(BaseModel):
    """What one ticket's step (drafting or review) spent."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


class TicketRecord(BaseModel):
    """One ticket's record: the seed's fields plus where it came from and what it cost."""

    category: str | None = None
    handler: str | None = None
    file: str | None = None
    one_line: str | None = None
    gate_rounds: int = 0
    gate_reports: list[str] = []
    stop: str | None = None
    status: TicketStatus = TicketStatus.CLAIMED
    source: str
    error: str | None = None
    draft: StepUsage = StepUsage()
    review: StepUsage = StepUsage()


class RunConfig(BaseModel):
    """The run's effective configuration, fixed at submit time so every worker agrees."""

    categories: list[str]
    pool_size: int
    max_rounds: int
    filler_phrases: list[str]
    model: str
    max_turns: int
    budget_usd: float | None
    stop_after: str | None = None


class RunRecord(BaseModel):
    """The whole run-state.json."""

    version: int = 1
    run_id: str
    started_at: str
    updated_at: str
    workspace: str
    status: RunPhase = RunPhase.RUNNING
    exit_code: int | None = None
    error: str | None = None
    config: RunConfig
    nodes: dict[str, NodeRecord] = {}
    tickets: dict[str, TicketRecord] = {}

    def done(self, node: str) -> bool:
        """True once `node` has finished."""
        return node in self.nodes and self.nodes[node].status == "ok"

    def end(self, status: RunPhase, exit_code: int | None, error: str | None = None) -> None:
        """Set where the run ended and the exit code cron will see."""
        self.status, self.exit_code, self.error = status, exit_code, error

    def begin(self, node: str) -> bool:
        """Open `node` if nobody has yet; True if this call opened it."""
        if node in self.nodes:
            return False
        self.nodes[node] = NodeRecord(started=time.time())
        return True

    def finish(
        self, node: str, calls: int = 0, tokens: int = 0, rounds: int | None = None
    ) -> NodeRecord:
        """Close `node` with its totals; its time runs from `begin` to now."""
        record = self.nodes.setdefault(node, NodeRecord(started=time.time()))
        record.ms = round((time.time() - (record.started or time.time())) * 1000)
        record.calls, record.tokens, record.rounds = calls, tokens, rounds
        record.status = "ok"
        return record


def new_run_id() -> str:
    """A sortable, unique run id: run-YYYYMMDD-HHMMSS-xxxx."""
    return f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


class RunStore:
    """The files of one run under `runs/<run_id>/`."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir.resolve()  # workers on other machines get this path as is

    @property
    def state_path(self) -> Path:
        """run-state.json of this run."""
        return self.dir / STATE_FILE

    @property
    def trace_path(self) -> Path:
        """run.jsonl of this run."""
        return self.dir / TRACE_FILE

    @property
    def report_path(self) -> Path:
        """The printed report of this run."""
        return self.dir / REPORT_FILE

    def draft_path(self, ticket_id: str) -> Path:
        """Where the drafting task leaves a draft for merge to publish."""
        return self.dir / "drafts" / f"{ticket_id}.txt"

    def agent_path(self, ticket_id: str, step: str) -> Path:
        """Harness state of one agent run (resumable without paying twice)."""
        return self.dir / "agents" / f"{ticket_id}.{step}.json"

    def ticket_path(self, ticket_id: str) -> Path:
        """The ticket's text as claimed into the run (later nodes read it from here)."""
        return self.dir / "tickets" / f"{ticket_id}.txt"

    def tracer(self, **fields: object) -> Tracer:
        """A tracer appending to this run's run.jsonl; the run id is the folder's name."""
        return Tracer(self.trace_path, self.dir.name, **fields)

    def read(self) -> RunRecord:
        """The current record; `RunStateError` if missing or corrupt."""
        try:
            return RunRecord.model_validate(json.loads(self.state_path.read_text(encoding="utf-8")))
        except FileNotFoundError as exc:
            raise RunStateError(f"no run state at {self.state_path}") from exc
        except (ValueError, ValidationError) as exc:
            raise RunStateError(f"corrupt run state at {self.state_path}: {exc}") from exc

    def version(self) -> tuple[int, int, int]:
        """Changes (almost always) when a writer replaces run-state.json: a new file each time."""
        info = self.state_path.stat()
        return info.st_ino, info.st_mtime_ns, info.st_size

    def write(self, record: RunRecord) -> None:
        """Write the record atomically (callers hold the lock, see `update`)."""
        record.updated_at = now_iso()
        atomic.write_text(self.state_path, record.model_dump_json(indent=2))

    @contextlib.contextmanager
    def update(self) -> Iterator[RunRecord]:
        """Read, let the caller change, and write the record, all under the run's lock."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            record = self.read()
            yield record
            self.write(record)
        finally:
            os.close(fd)  # closing the descriptor releases the lock


def link_latest(workspace_root: Path, store: RunStore) -> None:
    """Point <workspace>/run-state.json and run.jsonl at this run's files (atomic swap)."""
    for name in (STATE_FILE, TRACE_FILE):
        link = workspace_root / name
        tmp = workspace_root / f".{name}.{secrets.token_hex(4)}.tmp"
        tmp.symlink_to(os.path.relpath(store.dir / name, workspace_root))
        os.replace(tmp, link)


def record_crash(store: RunStore, exc: BaseException) -> int:
    """Mark the run crashed, with the error, in its state and its trace; return exit code 3."""
    error = f"{type(exc).__name__}: {exc}"
    with store.update() as record:
        record.end(RunPhase.CRASHED, ExitCode.CRASHED, error)
    store.tracer(node="run").emit("run_crashed", error=error)
    return ExitCode.CRASHED


def find(workspace_root: Path, run_id: str) -> RunStore:
    """The store of `run_id` in this workspace; `RunStateError` if there is none."""
    store = RunStore(workspace_root / "runs" / run_id)
    if not store.state_path.exists():
        raise RunStateError(f"no run {run_id!r} under {workspace_root / 'runs'}")
    return store
