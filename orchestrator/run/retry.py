"""What `resume` tries again: failed tickets go back to the step they failed in, keeping what
they paid, and the run is made resumable."""

from __future__ import annotations

from typing import Literal

from orchestrator.plan.steps import Plan, Step
from orchestrator.run.records import FAILED_STOPS, RunPhase
from orchestrator.run.store import ROUTER, RunStore
from workers.state import RunState
from workers.state import retry as retry_state

RetryPolicy = Literal["retryable", "all", "none"]


def reopen(store: RunStore, plan: Plan, retry: RetryPolicy = "retryable") -> list[str]:
    """Make a stopped, crashed or finished run resumable: failures that may pass on a retry
    (`retry`: those, all, none) go back to the step that failed, keeping what they paid.
    Returns the tickets that will be tried again."""
    again = [] if retry == "none" else _retry_failed(store, plan, force=retry == "all")
    with store.update_meta() as meta:
        if meta.status is not RunPhase.DONE or again:
            meta.end(RunPhase.RUNNING, None)
            meta.config.stop_after = None
    return again


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
        step = plan.failed_in(ticket.failed_in, store.draft_path(ticket_id).exists())
        ticket.status = step.takes or ticket.status
        ticket.stop, ticket.error, ticket.retryable, ticket.failed_in = None, None, False, None
        store.save_ticket(ticket_id, ticket)
        again.append(ticket_id)
        if earliest is None or plan.steps.index(step) < plan.steps.index(earliest):
            earliest = step
    for step in plan.from_step(earliest) if earliest is not None else ():
        store.node_path(step.node).unlink(missing_ok=True)
    return again


def _retry_agents(store: RunStore, ticket_id: str, force: bool) -> None:
    """Let the ticket's failed agent runs go on from their last paid turn."""
    for path in sorted((store.dir / "agents").glob(f"{ticket_id}.*.json")):
        state = RunState.load(path)
        if retry_state(state, force=force):
            state.save(path)
