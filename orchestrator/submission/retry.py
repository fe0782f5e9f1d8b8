"""What `resume` tries again: failed tickets go back to the step they failed in, keeping what
they paid, and the run is made resumable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from orchestrator.plan.steps import Plan, Step
from orchestrator.run import approvals, cancels
from orchestrator.run.records import FAILED_STOPS, Cancel, RunStatus, TicketStatus, WaitingCall
from orchestrator.run.store import ROUTER, RunStore
from workers.state import RunState
from workers.state import retry as retry_state
from workers.trace import now_iso

RetryPolicy = Literal["retryable", "all", "none"]


@dataclass
class Reopened:
    """What `resume` takes up again: failed tickets retried, decided ones, and how many
    still wait for a person."""

    retried: list[str] = field(default_factory=list)
    decided: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    still_waiting: int = 0
    cancels: list[Cancel] = field(default_factory=list)  # the cancels it lifted


def reopen(
    store: RunStore, plan: Plan, retry: RetryPolicy = "retryable", budget_usd: float | None = None
) -> Reopened:
    """Make a stopped, crashed or finished run resumable: failures that may pass on a retry
    (`retry`: those, all, none) go back to the step that failed, keeping what they paid;
    tickets whose waiting call a person decided go back to the step they stopped in; calls
    undecided past `[approvals] expire_h` end needs_human (`approval_expired`); a cancel
    of the run or of tickets is lifted (its tickets, stopped `cancelled`, are retried);
    `budget_usd` replaces what the whole run may spend (tickets stopped by it are retried)."""
    lifted = cancels.clear(store)
    taken = _take_up_decided(store, plan)
    taken.cancels = lifted
    taken.retried = [] if retry == "none" else _retry_failed(store, plan, force=retry == "all")
    again = taken.retried + taken.decided
    with store.update_meta() as meta:
        if meta.status is not RunStatus.DONE or again:
            meta.reopen()
            meta.config.stop_after = None
        meta.cancel = None
        meta.totals = None  # records may change (expired calls, retries): counted again at its end
        if budget_usd is not None:
            meta.config.run_budget_usd = budget_usd
    return taken


def _take_up_decided(store: RunStore, plan: Plan) -> Reopened:
    """Tickets waiting for a person: decided ones back to their step, old ones expired; a
    decision that does not count (approvals.standing) leaves its ticket waiting."""
    taken = Reopened()
    earliest: Step | None = None
    expire_s = approvals.expire_s(store.meta().config)
    for ticket_id, ticket in store.tickets().items():
        if ticket.status is not TicketStatus.AWAITING_APPROVAL or ticket.waiting is None:
            continue
        asked = _asked(store, ticket_id, ticket.waiting, ticket.stopped_in)
        found = approvals.standing(store, asked, expire_s)
        if found.decided is not None:
            step = plan.stopped_in(ticket.stopped_in, store.draft_path(ticket_id).exists())
            ticket.status = step.takes or ticket.status
            ticket.waiting, ticket.stop, ticket.stopped_in = None, None, None
            taken.decided.append(ticket_id)
            earliest = step if earliest is None or _before(plan, step, earliest) else earliest
        elif found.expired:
            ticket.status, ticket.stop = TicketStatus.NEEDS_HUMAN, "approval_expired"
            late = f" ({found.void})" if found.void else ""
            ticket.error = (
                f"call {asked.call_id} ({asked.tool}) waited {expire_s / 3600:g} h undecided{late}"
            )
            taken.expired.append(ticket_id)
        else:
            if found.void is not None:  # named in the trace: it is refused, nothing runs
                trace = store.tracer(node="approval", ticket=ticket_id)
                trace.emit("decision_refused", call_id=asked.call_id, why=found.void)
            taken.still_waiting += 1
            continue
        store.save_ticket(ticket_id, ticket)
    _redo(store, plan, earliest)
    return taken


def _asked(
    store: RunStore, ticket_id: str, waiting: WaitingCall, step: str | None
) -> approvals.Request:
    """The request of the call the ticket waits with; written again from its record if its
    file is gone, so that `pending` shows the call."""
    asked = approvals.request(store, ticket_id, waiting.call_id)
    if asked is None:
        asked = approvals.Request(
            run_id=store.run_id,
            ticket=ticket_id,
            call_id=waiting.call_id,
            tool=waiting.tool,
            args=waiting.args,
            args_hash=waiting.args_hash,
            asked_at=waiting.asked_at or now_iso(),
            step=step or "draft",
        )
        approvals.ask(store, asked)
    return asked


def _before(plan: Plan, a: Step, b: Step) -> bool:
    return plan.steps.index(a) < plan.steps.index(b)


def _redo(store: RunStore, plan: Plan, earliest: Step | None) -> None:
    """The nodes of `earliest` and every step after it run again."""
    for step in plan.from_step(earliest) if earliest is not None else ():
        store.node_path(step.node).unlink(missing_ok=True)


def _retry_failed(store: RunStore, plan: Plan, force: bool) -> list[str]:
    """Put failed tickets (and a failed router) back where they failed; their ids. The
    nodes of the earliest step one goes back to, and of every step after it, run again."""
    _retry_agents(store, ROUTER, force)
    again: list[str] = []
    earliest: Step | None = None
    for ticket_id, ticket in store.tickets().items():
        if ticket.stop not in FAILED_STOPS or not (ticket.retryable or force):
            continue
        _retry_agents(store, ticket_id, force)
        step = plan.stopped_in(ticket.stopped_in, store.draft_path(ticket_id).exists())
        ticket.status = step.takes or ticket.status
        ticket.stop, ticket.error, ticket.retryable, ticket.stopped_in = None, None, False, None
        store.save_ticket(ticket_id, ticket)
        again.append(ticket_id)
        if earliest is None or _before(plan, step, earliest):
            earliest = step
    _redo(store, plan, earliest)
    return again


def _retry_agents(store: RunStore, ticket_id: str, force: bool) -> None:
    """Let the ticket's failed agent runs go on from their last paid turn."""
    for path in sorted((store.dir / "agents").glob(f"{ticket_id}.*.json")):
        state = RunState.load(path)
        if retry_state(state, force=force):
            state.save(path)
