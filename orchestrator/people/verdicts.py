"""A person's verdict on a ticket of a run, kept like a decision (who, when, why, hashes):
a file created once in the run folder, and a label in the workspace's store.

    runs/<run>/handled/<ticket>.json   sent, edited or closed (ticketgraph handle)
    runs/<run>/audits/<ticket>.json    audit_good or audit_bad (ticketgraph audit)

A second verdict of the same kind on the same ticket of the same run is refused, naming the
first; the run's own files (its drafts, its agents' states, its records) are never changed.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from orchestrator.errors import UsageError
from orchestrator.people import labels, reply
from orchestrator.people.labels import GateLabel, GateRoundLabel, Label, Verdict
from orchestrator.run import ids
from orchestrator.run.records import TicketRecord
from orchestrator.run.store import RunStore
from workers.trace import now_iso

HANDLED, AUDITS = "handled", "audits"


class PersonVerdict(BaseModel):
    """What a person decided about a run's reply to one ticket."""

    run_id: str
    ticket: str
    verdict: Verdict
    by: str
    at: str
    reason: str | None = None
    draft_sha256: str  # the run's own reply, as it was judged
    final_sha256: str | None = None  # what went out (None: nothing did)
    out_file: str | None = None  # where it was published, relative to the workspace


def _path(store: RunStore, folder: str, ticket_id: str) -> Path:
    return store.dir / folder / f"{ids.ticket(ticket_id)}.json"


def read(store: RunStore, folder: str, ticket_id: str) -> PersonVerdict | None:
    """The verdict of this kind on the ticket, if one was recorded and can be read."""
    try:
        return PersonVerdict.model_validate_json(_path(store, folder, ticket_id).read_bytes())
    except (FileNotFoundError, ValidationError):
        return None


def all_of(store: RunStore, folder: str) -> dict[str, PersonVerdict]:
    """Every verdict of this kind in the run, by ticket."""
    found = {}
    for path in sorted((store.dir / folder).glob("*.json")):
        try:
            made = PersonVerdict.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            continue
        found[made.ticket] = made
    return found


def tickets_with(store: RunStore, folder: str) -> set[str]:
    """The tickets of the run with a verdict of this kind (names only: nothing parsed)."""
    return {p.name.removesuffix(".json") for p in (store.dir / folder).glob("*.json")}


def record(store: RunStore, folder: str, made: PersonVerdict) -> None:
    """Write the verdict, once: `UsageError` naming the earlier one if there is one."""
    path = _path(store, folder, made.ticket)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        earlier = read(store, folder, made.ticket)
        said = f" ({earlier.verdict} by {earlier.by} at {earlier.at})" if earlier else ""
        what = "handled" if folder == HANDLED else "audited"
        raise UsageError(f"{made.ticket} of run {store.run_id} was {what} already{said}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(made.model_dump_json())
        handle.flush()
        os.fsync(handle.fileno())


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
    workspace: Path,
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
