"""Auditing a share of the passes: `[review] audit_share` of the replies the gate passed
(0 by default) are sampled, deterministically, into the queue as "audit"; a person marks
each good or bad (with a reason), which is recorded once (runs/<run>/audits/<ticket>.json)
and kept as a label. Nothing waits on an audit: the reply went out as the run published it.

The sample: a pass of ticket T in run R is audited when the first 8 bytes of
sha256("R/T"), read as a big-endian integer over 2**64, are below the share. The same run
and ticket are always in or out, whoever asks and however often."""

from __future__ import annotations

import hashlib

from orchestrator.config.workspace import Workspace
from orchestrator.errors import UsageError
from orchestrator.people import verdicts
from orchestrator.run import ids
from orchestrator.run import verdicts as kept
from orchestrator.run.records import TicketStatus
from orchestrator.run.store import find
from orchestrator.run.verdicts import AUDITS, PersonVerdict


def sampled(run_id: str, ticket_id: str, share: float) -> bool:
    """True when the pass of `ticket_id` in `run_id` falls in an `share` audit sample."""
    if share <= 0:
        return False
    digest = hashlib.sha256(f"{run_id}/{ticket_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def audit(
    workspace: Workspace, run_id: str, ticket_id: str, good: bool, by: str, reason: str | None
) -> PersonVerdict:
    """Record a person's audit of a pass (sampled or not); `UsageError` for a ticket that did
    not pass, or one audited already."""
    store = find(workspace, run_id)
    record = store.record(ids.ticket(ticket_id))
    if record.status is not TicketStatus.PASS:
        raise UsageError(
            f"{ticket_id} of run {run_id} did not pass the gate (it is {record.status.value}): "
            f"only a pass is audited; ticketgraph handle {run_id} {ticket_id} for this one"
        )
    if not good and not (reason or "").strip():
        raise UsageError("say why the reply is bad (--reason TEXT): the label keeps it")
    draft = verdicts.run_reply(store, ticket_id, record)
    verdict = "audit_good" if good else "audit_bad"
    final = draft if good else None
    made = verdicts.made_now(store, ticket_id, verdict, by, reason, draft, final)
    kept.record(store, AUDITS, made)
    store.tracer(node="person", ticket=ticket_id).emit(
        "audited", verdict=verdict, by=by, reason=reason or None
    )
    verdicts.label(workspace, store, record, made, draft, final)
    return made
