"""Handling a ticket that needs a person: send the run's own reply as it is, send an edited
reply, or close the ticket without one. Recorded once per run and ticket
(runs/<run>/handled/<ticket>.json: who, when, why, the hashes of the run's reply and of what
went out), traced (`handled`), and kept as a label. A reply that goes out is written to
out/<ticket>.txt atomically; the run's own drafts are never touched. Read and written in
the run folder only: no Redis, no workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orchestrator.config.workspace import Workspace
from orchestrator.errors import UsageError
from orchestrator.people import reply, verdicts
from orchestrator.run import ids
from orchestrator.run import verdicts as kept
from orchestrator.run.records import TicketStatus
from orchestrator.run.store import RunStore, find
from orchestrator.run.verdicts import HANDLED, PersonVerdict
from workers import atomic

Action = Literal["send", "edit", "close"]


@dataclass(frozen=True)
class Handled:
    """What a handling did: its record, and the out/ file it wrote (if any)."""

    made: PersonVerdict
    changed: bool  # the reply that went out differs from the run's own


def handle(
    workspace: Workspace,
    run_id: str,
    ticket_id: str,
    action: Action,
    by: str,
    reason: str | None = None,
    edited: str | None = None,
) -> Handled:
    """Handle `ticket_id` of `run_id` (`edited`: the reply's text for `edit`); `UsageError`
    for a ticket that does not need a person or was handled already."""
    store = find(workspace, run_id)
    record = store.record(ids.ticket(ticket_id))
    if record.status is not TicketStatus.NEEDS_HUMAN:
        raise UsageError(_not_handleable(store, ticket_id, record.status))
    if (earlier := kept.read(store, HANDLED, ticket_id)) is not None:
        raise UsageError(
            f"{ticket_id} of run {run_id} was handled already ({earlier.verdict} by "
            f"{earlier.by} at {earlier.at})"
        )
    # Sending needs the run's reply; an edit or a close stands without one (a worker that
    # failed drafted none), and its label says the draft was empty.
    draft = verdicts.run_reply(store, ticket_id, record) if action == "send" else None
    draft = draft if draft is not None else (reply.final_text(store, ticket_id, record) or "")
    final = _final(action, draft, edited)
    verdict = "closed" if final is None else ("sent" if final == draft else "edited")
    out = None if final is None else ids.out_name(ticket_id)
    made = verdicts.made_now(store, ticket_id, verdict, by, reason, draft, final, out)
    kept.record(store, HANDLED, made)
    if final is not None:
        atomic.write_text(ids.out_file(workspace, ticket_id), final + "\n")
    store.tracer(node="person", ticket=ticket_id).emit(
        "handled", verdict=verdict, by=by, reason=reason or None, out_file=out
    )
    verdicts.label(workspace, store, record, made, draft, final)
    _report_again(store)
    return Handled(made, changed=final is not None and final != draft)


def _final(action: Action, draft: str, edited: str | None) -> str | None:
    """What goes out: the run's reply, the person's, or nothing."""
    if action == "close":
        return None
    if action == "send":
        return draft
    text = (edited or "").strip()
    if not text:
        raise UsageError("the reply file is empty: write the reply in it, or use --close")
    return text


def _not_handleable(store: RunStore, ticket_id: str, status: TicketStatus) -> str:
    """Why a ticket of this status cannot be handled, and what to do instead."""
    if status is TicketStatus.AWAITING_APPROVAL:
        return (
            f"{ticket_id} of run {store.run_id} waits for a decision on a tool call: "
            f"ticketgraph approve/reject {store.run_id} {ticket_id}, then resume"
        )
    if status is TicketStatus.PASS:
        return (
            f"{ticket_id} of run {store.run_id} passed the gate: nothing to handle "
            f"(ticketgraph audit {store.run_id} {ticket_id} --good|--bad to judge its reply)"
        )
    return (
        f"{ticket_id} of run {store.run_id} is still {status.value}: only a ticket that "
        "needs a human can be handled (ticketgraph queue)"
    )


def _report_again(store: RunStore) -> None:
    """Write an ended run's report again, the handled ticket listed apart from those that
    still need a person (a run still going writes its own at its end)."""
    from orchestrator.steps import report

    if not store.report_path.exists():
        return
    handled = kept.all_of(store, HANDLED)
    text, _ = report.rendered(store.read(), handled=handled)
    store.write(store.report_path, text)
