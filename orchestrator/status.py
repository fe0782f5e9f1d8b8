"""`ticketgraph status`: one run as it stands, read from its folder (running or finished),
for a person or, with --json, for a program."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from orchestrator import report, runstate
from orchestrator.errors import UsageError
from orchestrator.records import FAILED_STOPS, RunRecord, TicketStatus
from orchestrator.runstate import RunStore

SCHEMA_VERSION = 1


def latest(workspace: Path) -> RunStore:
    """The workspace's newest run; `UsageError` if it has none."""
    runs = sorted(p.parent.name for p in (workspace / "runs").glob("*/run.json"))
    if not runs:
        raise UsageError(f"no runs under {workspace / 'runs'} yet")
    return runstate.find(workspace, runs[-1])


def document(record: RunRecord) -> dict[str, Any]:
    """The machine-readable status: schema_version, the run's verdict and cost, and the
    whole record (nodes and tickets, as in run-state.json)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": record.run_id,
        "status": record.status.value,
        "exit_code": record.exit_code,
        "tickets": len(record.tickets),
        "by_status": dict(Counter(t.status.value for t in record.tickets.values())),
        "cost_usd": round(sum(n.cost_usd for n in record.nodes.values()), 8),
        "record": json.loads(record.model_dump_json()),
    }


def text(record: RunRecord) -> str:
    """The status for a person: where the run is, what it cost, who needs a human and why."""
    by_status = Counter(t.status.value for t in record.tickets.values())
    counts = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    code = "" if record.exit_code is None else f", exit {record.exit_code}"
    lines = [f"run {record.run_id}: {record.status.value}{code}; {len(record.tickets)} tickets"]
    lines.append(f"  {counts}")
    lines += report.node_table(record)
    human = [(i, t) for i, t in record.tickets.items() if t.status is TicketStatus.NEEDS_HUMAN]
    if human:
        lines.append(f"need a human: {len(human)}")
        for ticket_id, t in human:
            why = t.error if t.stop in FAILED_STOPS or t.error else (t.summary or t.one_line)
            lines.append(f"  - {ticket_id} ({t.stop}): {why}")
    if record.error:
        lines.append(f"error: {record.error}")
    return "\n".join(lines) + "\n"
