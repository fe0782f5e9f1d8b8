"""A run's own reply to a ticket, and what its gate said of it, read from the run folder:
the text the run ended with (its last rewrite's, or its first draft's), the gate's verdict
at every round (from run.jsonl), and the facts the reply could draw on (the ticket and its
tool results). Never out/<ticket>.txt: a later run, or a person, may have replaced it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.run.records import REPORT_SEPARATOR, TicketRecord
from orchestrator.run.store import RunStore
from workers import atomic, versions


@dataclass(frozen=True)
class GateRound:
    """The gate's verdict on one round's text."""

    round: int
    passed: bool
    reports: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The label's form: {"round", "passed", "reports"}."""
        return {"round": self.round, "passed": self.passed, "reports": list(self.reports)}


def sha256(text: str) -> str:
    """The hex sha256 of a reply's text (UTF-8), as labels and handling records name it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def final_text(store: RunStore, ticket_id: str, record: TicketRecord) -> str | None:
    """The reply the run ended with for the ticket (None: it drafted none)."""
    for k in range(record.gate_rounds, 0, -1):
        output = _agent_output(store.agent_path(ticket_id, f"review-{k}"))
        if output is not None:
            return output
    path = store.draft_path(ticket_id)
    try:
        return atomic.read_bytes(path).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _agent_output(path: Path) -> str | None:
    try:
        state = versions.read_json(path)
    except (OSError, ValueError):
        return None
    output = state.get("output") if isinstance(state, dict) else None
    return output.strip() if isinstance(output, str) and output.strip() else None


def gate_rounds(store: RunStore, ticket_id: str, record: TicketRecord) -> list[GateRound]:
    """The gate's verdict at each round, from the run's trace (the record's reports when the
    trace holds none: a run from before, or a trace cut short)."""
    found: dict[int, GateRound] = {}
    try:
        lines = store.trace_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        if f'"{ticket_id}"' not in line or '"gate"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "gate" and event.get("ticket") == ticket_id:
            n = int(event.get("round", 0))
            found[n] = GateRound(n, bool(event.get("pass")), split(event.get("report") or ""))
    if found:
        return [found[n] for n in sorted(found)]
    rounds = [GateRound(n, False, split(r)) for n, r in enumerate(record.gate_reports)]
    if record.stop == "gate_pass":
        rounds.append(GateRound(len(rounds), True, []))
    return rounds


def split(report: str) -> list[str]:
    """One round's gate report as its problems (`filler_word:...`, `missing_ticket_id`)."""
    return [part for part in report.split(REPORT_SEPARATOR) if part]


def ticket_text(store: RunStore, ticket_id: str) -> str:
    """The ticket's text as the run read it ('' if it cannot be read)."""
    try:
        return atomic.read_bytes(store.ticket_path(ticket_id)).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def tool_results(store: RunStore, ticket_id: str, record: TicketRecord) -> list[str]:
    """Every tool result the ticket's worker runs got (what `unsupported_fact` checks
    a reply's order ids and amounts against, besides the ticket)."""
    facts: list[str] = []
    steps = ["draft", *(f"review-{k}" for k in range(1, record.gate_rounds + 1))]
    for step in steps:
        try:
            state = versions.read_json(store.agent_path(ticket_id, step))
        except (OSError, ValueError):
            continue
        messages = state.get("messages", []) if isinstance(state, dict) else []
        facts += [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    return facts
