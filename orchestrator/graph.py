"""The plan of a run: which step follows which, and how many tickets are in flight.

    route ──▶ draft(ticket) × N, at most pool_size in flight ──▶ merge
          ──▶ review(ticket) × N, at most pool_size in flight ──▶ report

Each arrow is a message sent by the task that finishes the step before it, carrying only the
run folder, the submission's `attempt` id and a ticket id. A fan-out starts `pool_size`
ticket tasks; each one that finishes sends the next ticket (no lanes, no waves), and the one
that finishes the last ticket sends the barrier. `submit` starts a run, or resumes one, at the
first step its records show unfinished.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from orchestrator import dispatch
from orchestrator.app import app
from orchestrator.records import RunRecord, TicketStatus
from orchestrator.runstate import RunStore


@dataclass(frozen=True)
class FanOut:
    """A per-ticket step, the tickets it takes, and the barrier that follows it."""

    phase: str
    task: str
    takes: TicketStatus
    then: str


log = logging.getLogger(__name__)

DRAFT = FanOut("draft", "orchestrator.draft", TicketStatus.ROUTED, "orchestrator.merge")
REVIEW = FanOut("review", "orchestrator.review", TicketStatus.DRAFTED, "orchestrator.report")


def submit(r: redis.Redis, store: RunStore, record: RunRecord, attempt: str) -> None:
    """Send the first unfinished step of the run."""
    dispatch.mark_submitted(r, store.run_id, attempt)
    run_dir = str(store.dir)
    if not record.done("route"):
        _send("orchestrator.route", run_dir, attempt)
    elif not record.done("merge"):
        fan_out(r, DRAFT, store, attempt, _taking(record, DRAFT), record.config.pool_size)
    elif not record.done("report"):
        fan_out(r, REVIEW, store, attempt, _taking(record, REVIEW), record.config.pool_size)
    else:
        _send("orchestrator.report", run_dir, attempt)


def fan_out(
    r: redis.Redis, step: FanOut, store: RunStore, attempt: str, ticket_ids: list[str], pool: int
) -> None:
    """Start a fan-out over `ticket_ids`; with none to take, go straight to its barrier."""
    phase = dispatch.Phase(store.run_id, attempt, step.phase)
    first = dispatch.start(r, phase, ticket_ids, pool)
    if not ticket_ids:
        _send(step.then, str(store.dir), attempt)
    for ticket_id in first:
        _send(step.task, str(store.dir), attempt, ticket_id)


def hand_on(r: redis.Redis, step: FanOut, store: RunStore, attempt: str, ticket_id: str) -> None:
    """A ticket is done: send the next one into its slot, and the barrier after the last."""
    handoff = dispatch.advance(r, dispatch.Phase(store.run_id, attempt, step.phase), ticket_id)
    if handoff.lost:
        log.warning(
            "run %s: the broker lost the %s phase (restarted without its data); %s is recorded, "
            "and `ticketgraph resume %s` finishes the run",
            store.run_id,
            step.phase,
            ticket_id,
            store.run_id,
        )
        return
    if handoff.next_ticket is not None:
        _send(step.task, str(store.dir), attempt, handoff.next_ticket)
    if handoff.barrier:
        _send(step.then, str(store.dir), attempt)


def sweep(r: redis.Redis, store: RunStore, attempt: str, age_s: float) -> int:
    """Send again what was sent `age_s` ago and never taken (its message died with a worker
    between the broker handing it out and the worker recording it); return how many.

    A duplicate is harmless: whichever copy starts first holds the ticket, the other steps
    aside, and a barrier's steps are idempotent.
    """
    resent = 0
    for step in (DRAFT, REVIEW):
        lost = dispatch.sweep(r, dispatch.Phase(store.run_id, attempt, step.phase), age_s)
        for ticket_id in lost.tickets:
            _send(step.task, str(store.dir), attempt, ticket_id)
        if lost.barrier:
            _send(step.then, str(store.dir), attempt)
        resent += len(lost.tickets) + lost.barrier
        if lost.tickets or lost.barrier:
            log.warning(
                "run %s: %s sent again (lost with a worker): %s",
                store.run_id,
                step.phase,
                ", ".join(lost.tickets + ([step.then] if lost.barrier else [])),
            )
    return resent


def _taking(record: RunRecord, step: FanOut) -> list[str]:
    return [i for i, t in record.tickets.items() if t.status is step.takes]


def _send(task: str, *args: str) -> None:
    app.send_task(task, args=list(args), ignore_result=True)
