"""A person's verdict on a ticket of a run, kept like a decision (who, when, why, hashes):
a file created once in the run folder (orchestrator/run/verdicts.py), and a label in the
workspace's store. The run's own files (its drafts, its agents' states, its records) are never
changed.
"""

from __future__ import annotations

from orchestrator.config.workspace import Workspace
from orchestrator.errors import UsageError
from orchestrator.people import labels, reply
from orchestrator.people.labels import GateLabel, GateRoundLabel, Label
from orchestrator.run.records import TicketRecord
from orchestrator.run.store import RunStore
from orchestrator.run.verdicts import PersonVerdict, Verdict
from workers.trace import now_iso


def made_now(
    store: RunStore,
    ticket_id: str,
    verdict: Verdict,
    by: str,
    reason: str | None,
    draft: str,
    final: str | None,
    out_file: str | None = None,
) -> PersonVerdict:
    """A verdict made now, with the hashes of the run's reply and of what went out."""
    return PersonVerdict(
        run_id=store.run_id,
        ticket=ticket_id,
        verdict=verdict,
        by=by,
        at=now_iso(),
        reason=reason or None,
        draft_sha256=reply.sha256(draft),
        final_sha256=None if final is None else reply.sha256(final),
        out_file=out_file,
    )


def label(
    workspace: Workspace,
    store: RunStore,
    record_: TicketRecord,
    made: PersonVerdict,
    draft: str,
    final: str | None,
) -> Label:
    """Append the label a verdict leaves (the run's reply, the gate each round, the
    person's verdict, the final text) to the workspace's store; the label."""
    rounds = reply.gate_rounds(store, made.ticket, record_)
    found = Label(
        run=made.run_id,
        ticket=made.ticket,
        category=record_.category,
        draft=draft,
        draft_sha256=made.draft_sha256,
        gate=GateLabel(
            verdict=record_.status.value,
            rounds=[GateRoundLabel(**r.as_dict()) for r in rounds],
        ),
        verdict=made.verdict,
        final=final,
        by=made.by,
        at=made.at,
        reason=made.reason,
        ticket_text=reply.ticket_text(store, made.ticket),
        facts=reply.tool_results(store, made.ticket, record_),
        final_sha256=made.final_sha256,
    )
    labels.append(workspace, found)
    return found


def run_reply(store: RunStore, ticket_id: str, record_: TicketRecord) -> str:
    """The run's own reply to the ticket; `UsageError` when it drafted none."""
    text = reply.final_text(store, ticket_id, record_)
    if text is None:
        raise UsageError(
            f"run {store.run_id} drafted no reply to {ticket_id} (it is {record_.status.value}"
            f"{', stop ' + record_.stop if record_.stop else ''}): use --reply-file or --close"
        )
    return text
