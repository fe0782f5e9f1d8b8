"""`ticketgraph status`: one run as it stands, read from its folder (running or finished),
for a person or, with --json, for a program."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.config.workspace import Workspace
from orchestrator.errors import GraphError, UsageError
from orchestrator.exit_codes import ExitCode
from orchestrator.run import store, verdicts
from orchestrator.run.records import (
    FAILED_STOPS,
    BudgetTotals,
    Cancel,
    RunRecord,
    RunStatus,
    TicketStatus,
    WaitingCall,
)
from orchestrator.run.store import REPORT_FILE, RunStore
from orchestrator.run.verdicts import PersonVerdict
from orchestrator.steps import report

SCHEMA_VERSION = 1
# docs/run-document.schema.json is this model's JSON schema (a test keeps them equal).
Verdict = Literal["all_pass", "needs_human", "stopped", "crashed", "running", "nothing_to_claim"]


class WaitingRow(WaitingCall):
    """A call that waits for a person, with its ticket."""

    ticket: str


class RunDocument(BaseModel):
    """What `run --json`, `resume --json` and `status --json` print: one JSON document."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    run_id: str | None  # None: inbox/ had nothing to claim, so no run started
    status: str | None  # running, stopped_early, crashed or done
    verdict: Verdict
    exit_code: int | None  # the exit code of the command (None: still running)
    tickets: int
    by_status: dict[str, int]  # ticket status -> how many
    cost_usd: float
    duration_s: float | None  # from the run's start to its last update
    report: str | None  # the report file, relative to the workspace (once written)
    # Tool calls that wait for a person's decision (ticketgraph approve / reject).
    awaiting_approval: list[WaitingRow] = []
    cancel: Cancel | None = None  # who cancelled the run and why (ticketgraph cancel)
    # needs_human tickets a person handled since (ticketgraph handle): sent, edited, closed.
    handled: list[PersonVerdict] = []
    # What the run may spend and has spent ([run] budget_usd, --budget; coordination/budget.py).
    budget: BudgetTotals | None = None
    record: RunRecord | None  # run-state.json: config, every node and every ticket


class RunRow(BaseModel):
    """One line of `ticketgraph runs` (and one item of `runs --json`)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    started_at: str
    status: str
    verdict: Verdict
    exit_code: int | None
    tickets: int
    need_a_human: int  # needs_human tickets nobody handled yet
    handled: int = 0  # needs_human tickets a person handled (ticketgraph handle)
    awaiting_approval: int = 0
    cancelled: bool = False
    budget_usd: float | None = None  # what the run may spend (None: no limit)
    budget: BudgetTotals | None = None  # the same object as the run document's
    cost_usd: float
    duration_s: float | None


def find(workspace: Workspace, run_id: str | None) -> RunStore:
    """Run `run_id` of the workspace, or its newest; `UsageError` if there is no such run
    (or no workspace)."""
    workspace.require()
    if run_id:
        return store.find(workspace, run_id)
    runs = sorted(p.parent.name for p in (workspace.runs).glob("*/run.json"))
    if not runs:
        raise UsageError(f"no runs under {workspace.runs} yet")
    return store.find(workspace, runs[-1])


def verdict(record: RunRecord) -> Verdict:
    """The run's outcome as one word."""
    return verdict_of(record.status.value, record.exit_code)


def verdict_of(status: str, exit_code: int | None) -> Verdict:
    """The outcome of a run with this status (RunStatus's value) and exit code, as one word."""
    if status == RunStatus.RUNNING.value:
        return "running"
    return {
        ExitCode.ALL_PASS: "all_pass",
        ExitCode.NEEDS_HUMAN: "needs_human",
        ExitCode.STOPPED: "stopped",
    }.get(exit_code, "crashed")  # type: ignore[return-value, arg-type]


def duration_s(record: RunRecord) -> float | None:
    """Seconds from the run's start to its last update (None if a time cannot be read)."""
    return seconds_between(record.started_at, record.updated_at)


def seconds_between(start: str, end: str | None) -> float | None:
    """Seconds from one ISO time of a run's files to another (None: to now); None if a time
    cannot be read."""
    try:
        began = _moment(start)
        until = datetime.now(UTC) if end is None else _moment(end)
    except ValueError:
        return None
    return round((until - began).total_seconds(), 3)


def _moment(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def handled_of(found: RunStore) -> dict[str, PersonVerdict]:
    """The run's tickets a person handled, by ticket (runs/<run>/handled/)."""
    return verdicts.all_of(found, verdicts.HANDLED)


def document(
    record: RunRecord,
    exit_code: int | None = None,
    handled: dict[str, PersonVerdict] | None = None,
) -> dict[str, Any]:
    """The machine-readable run: schema_version, verdict, exit code, cost, and the whole
    record (nodes and tickets, as in run-state.json). `exit_code`: the command's, when it
    differs from the run's (a wait that ended before the verdict); `handled`: the tickets a
    person handled (`handled_of`)."""
    report_file = Path("runs") / record.run_id / REPORT_FILE
    doc = RunDocument(
        schema_version=SCHEMA_VERSION,
        run_id=record.run_id,
        status=record.status.value,
        verdict=verdict(record),
        exit_code=record.exit_code if exit_code is None else exit_code,
        tickets=len(record.tickets),
        by_status=dict(Counter(t.status.value for t in record.tickets.values())),
        cost_usd=report.cost(record),
        duration_s=duration_s(record),
        report=str(report_file) if record.status is RunStatus.DONE else None,
        awaiting_approval=waiting(record),
        cancel=record.cancel,
        handled=list((handled or {}).values()),
        budget=report.budget(record),
        record=record,
    )
    return json.loads(doc.model_dump_json())


def waiting(record: RunRecord) -> list[WaitingRow]:
    """The run's calls that wait for a person, oldest first."""
    rows = [
        WaitingRow(ticket=ticket_id, **dict(t.waiting))
        for ticket_id, t in record.tickets.items()
        if t.waiting is not None
    ]
    return sorted(rows, key=lambda r: r.asked_at)


def nothing_to_claim() -> dict[str, Any]:
    """The document of a `run` that found nothing to claim (no run, nothing paid)."""
    doc = RunDocument(
        schema_version=SCHEMA_VERSION,
        run_id=None,
        status=None,
        verdict="nothing_to_claim",
        exit_code=ExitCode.ALL_PASS,
        tickets=0,
        by_status={},
        cost_usd=0.0,
        duration_s=None,
        report=None,
        record=None,
    )
    return json.loads(doc.model_dump_json())


def schema() -> dict[str, Any]:
    """The JSON schema of the documents (docs/run-document.schema.json)."""
    return RunDocument.model_json_schema()


def recent(workspace: Workspace, limit: int) -> list[RunRow]:
    """The workspace's newest `limit` runs, newest first; a run whose files cannot be read
    is listed with status `unreadable` rather than hiding the others. `UsageError` if the
    folder is not a workspace."""
    workspace.require()
    ids = sorted((p.parent.name for p in (workspace.runs).glob("*/run.json")), reverse=True)
    rows = []
    for run_id in ids[:limit]:
        try:
            found = store.find(workspace, run_id)
            record = found.read()
            handled = verdicts.tickets_with(found, verdicts.HANDLED)
        except (GraphError, ValueError, OSError):
            rows.append(
                RunRow(
                    run_id=run_id,
                    started_at="",
                    status="unreadable",
                    verdict="crashed",
                    exit_code=None,
                    tickets=0,
                    need_a_human=0,
                    cost_usd=0.0,
                    duration_s=None,
                )
            )
            continue
        rows.append(
            RunRow(
                run_id=run_id,
                started_at=record.started_at,
                status=record.status.value,
                verdict=verdict(record),
                exit_code=record.exit_code,
                tickets=len(record.tickets),
                need_a_human=sum(
                    t.status is TicketStatus.NEEDS_HUMAN and i not in handled
                    for i, t in record.tickets.items()
                ),
                handled=len(handled),
                awaiting_approval=len(waiting(record)),
                cancelled=record.cancel is not None,
                budget_usd=record.config.run_budget_usd,
                budget=report.budget(record),
                cost_usd=report.cost(record),
                duration_s=duration_s(record),
            )
        )
    return rows


def runs_table(rows: list[RunRow]) -> str:
    """`ticketgraph runs` for a person: one run per line, newest first."""
    lines = [
        f"{'Run':<26}{'Started':<22}{'Verdict':<13}{'Exit':<6}{'Tickets':<9}"
        f"{'Human':<7}{'Handled':<9}{'Waiting':<9}{'Cost':<19}Duration"
    ]
    for row in rows:
        code = "-" if row.exit_code is None else str(row.exit_code)
        took = "-" if row.duration_s is None else f"{row.duration_s:.1f} s"
        shown = "cancelled" if row.cancelled else row.verdict
        lines.append(
            f"{row.run_id:<26}{row.started_at[:19]:<22}{shown:<13}{code:<6}"
            f"{row.tickets:<9}{row.need_a_human:<7}{row.handled:<9}{row.awaiting_approval:<9}"
            f"{_spent(row):<19}{took}"
        )
    return "\n".join(lines) + "\n"


def _spent(row: RunRow) -> str:
    spent = report.usd(row.cost_usd)
    return spent if row.budget_usd is None else f"{spent} of ${row.budget_usd:.2f}"


def text(record: RunRecord, handled: dict[str, PersonVerdict] | None = None) -> str:
    """The status for a person: where the run is, what it cost, who needs a human and why,
    and apart from them, the tickets a person handled (`handled`)."""
    handled = handled or {}
    by_status = Counter(t.status.value for t in record.tickets.values())
    counts = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    code = "" if record.exit_code is None else f", exit {record.exit_code}"
    lines = [f"run {record.run_id}: {record.status.value}{code}; {len(record.tickets)} tickets"]
    lines.append(f"  {counts}")
    lines += report.node_table(record)
    if (line := report.budget_line(report.budget(record))) is not None:
        lines.append(line)
    human = [
        (i, t)
        for i, t in record.tickets.items()
        if t.status is TicketStatus.NEEDS_HUMAN and i not in handled
    ]
    if human:
        lines.append(f"need a human: {len(human)}")
        for ticket_id, t in human:
            why = t.error if t.stop in FAILED_STOPS or t.error else (t.summary or t.one_line)
            lines.append(f"  - {ticket_id} ({t.stop}): {why}")
    lines += report.handled_lines(handled)
    calls = waiting(record)
    if calls:
        lines.append(f"waiting for a decision: {len(calls)}")
        for row in calls:
            lines += report.waiting_lines(record.run_id, row.ticket, row)
    if record.cancel is not None:
        lines.append(f"cancelled: {record.cancel.why} (at {record.cancel.at})")
    elif record.error:
        lines.append(f"error: {record.error}")
    return "\n".join(lines) + "\n"
