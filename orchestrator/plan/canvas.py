"""The canvas: which message each step sends, derived from the plan's table.

Each arrow of the plan is a message sent by the task that finishes the step before it,
carrying only the run folder, the submission's `attempt` id and a ticket id. A whole-run
step sends the step after it, or, if that one is per-ticket, starts its fan-out: the first
`pool_size` tickets it takes; each ticket's task that finishes sends the next ticket into its
slot (no lanes, no waves), and the one that finishes the last sends the barrier — the step
after, or, when that is per-ticket too, `orchestrator.fan_out` to start it. `submit` starts
a run, or resumes one, at the first step its records show unfinished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from orchestrator.broker.app import app
from orchestrator.coordination import events, fanout
from orchestrator.plan.steps import Plan, Step
from orchestrator.run.store import RunStore

FAN_OUT_TASK = "orchestrator.fan_out"  # starts a per-ticket step after another one

log = logging.getLogger(__name__)


def submit(r: redis.Redis, plan: Plan, store: RunStore, attempt: str) -> None:
    """Send the first unfinished step of the run (the last one again if all are done: it
    reports the verdict it recorded). The records are read only for a per-ticket step."""
    events.mark_submitted(r, store.run_id, attempt)
    step = plan.first_unfinished(store.nodes()) or plan.steps[-1]

    def takers() -> tuple[list[str], int]:
        taken = [i for i, t in store.records() if t.status is step.takes]
        return taken, store.meta().config.pool_size

    _start(r, plan, step, store, attempt, takers)


def _start(
    r: redis.Redis,
    plan: Plan,
    step: Step,
    store: RunStore,
    attempt: str,
    taking: Callable[[], tuple[list[str], int]],
) -> None:
    """Send `step`: its task, for a whole-run step; for a per-ticket one, its fan-out over
    the tickets `taking` gives, at most the pool size it gives in flight (asked only then)."""
    if step.per_ticket:
        fan_out(r, plan, step, store, attempt, *taking())
    else:
        _send(step.task, str(store.dir), attempt)


def fan_out(
    r: redis.Redis,
    plan: Plan,
    step: Step,
    store: RunStore,
    attempt: str,
    ticket_ids: list[str],
    pool: int,
) -> None:
    """Start the fan-out of a per-ticket step over `ticket_ids`; with none to take, go
    straight to its barrier."""
    first = fanout.start(r, fanout.FanOut(store.run_id, attempt, step.name), ticket_ids, pool)
    if not ticket_ids:
        _barrier(plan, step, store, attempt)
    for ticket_id in first:
        _send(step.task, str(store.dir), attempt, ticket_id)


def send_next(
    r: redis.Redis,
    plan: Plan,
    step: Step,
    store: RunStore,
    attempt: str,
    taking: list[str],
    pool: int,
) -> None:
    """A whole-run step finished: send the step after it (a fan-out over `taking`, at most
    `pool` in flight, if it is per-ticket)."""
    if (after := plan.after(step)) is not None:
        _start(r, plan, after, store, attempt, lambda: (taking, pool))


def hand_on(
    r: redis.Redis,
    plan: Plan,
    step: Step,
    store: RunStore,
    attempt: str,
    ticket_id: str,
    delivery: str,
    keep: bool = False,
    ttl_s: int = 0,
) -> str | None:
    """A ticket is done: the next one goes into its slot, and the barrier after the last.
    With `keep` the next ticket is held for `delivery` and returned for the caller to run
    (coordination/slot.py); None if another delivery holds it (a duplicate message got there first:
    that one runs it). Without `keep` it is sent a message, and None returned."""
    fan = fanout.FanOut(store.run_id, attempt, step.name)
    handoff = fanout.advance(r, fan, ticket_id, delivery, keep=keep, ttl_s=ttl_s)
    if handoff.lost:
        log.warning(
            "run %s: the broker lost the %s fan-out (restarted without its data); %s is "
            "recorded, and `ticketgraph resume %s` finishes the run",
            store.run_id,
            step.name,
            ticket_id,
            store.run_id,
        )
        return None
    if handoff.barrier:
        _barrier(plan, step, store, attempt)
    if keep:
        return handoff.next_ticket if handoff.held else None
    if handoff.next_ticket is None:
        return None
    _send(step.task, str(store.dir), attempt, handoff.next_ticket)
    return None


def sweep(r: redis.Redis, plan: Plan, store: RunStore, attempt: str, age_s: float) -> int:
    """Send again what was sent `age_s` ago and never taken (its message died with a worker
    between the broker handing it out and the worker recording it); return how many.

    A duplicate is harmless: whichever copy starts first holds the ticket, the other steps
    aside, and a barrier's steps are idempotent.
    """
    resent = 0
    for step in (s for s in plan if s.per_ticket):
        lost = fanout.sweep(r, fanout.FanOut(store.run_id, attempt, step.name), age_s)
        for ticket_id in lost.tickets:
            _send(step.task, str(store.dir), attempt, ticket_id)
        if lost.barrier:
            _barrier(plan, step, store, attempt)
        resent += len(lost.tickets) + lost.barrier
        if lost.tickets or lost.barrier:
            names = [*lost.tickets, *(["the barrier"] if lost.barrier else [])]
            log.warning(
                "run %s: %s sent again (lost with a worker): %s",
                store.run_id,
                step.name,
                ", ".join(names),
            )
    return resent


def _barrier(plan: Plan, step: Step, store: RunStore, attempt: str) -> None:
    """What follows the last ticket of a per-ticket step: the next step, or the start of the
    next per-ticket step's fan-out."""
    after = plan.after(step)
    if after is None:
        return
    if after.per_ticket:
        _send(FAN_OUT_TASK, str(store.dir), attempt, after.name)
    else:
        _send(after.task, str(store.dir), attempt)


def _send(task: str, *args: str) -> None:
    # The args as Flower shows them, made here: Celery's own (saferepr, for any object)
    # cost a sixth of each send, for three short strings whose repr is the same.
    shown = repr(list(args))
    app.send_task(task, args=list(args), ignore_result=True, argsrepr=shown, kwargsrepr="{}")
