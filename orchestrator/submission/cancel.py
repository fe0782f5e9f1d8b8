"""Cancelling a run from any machine: `ticketgraph cancel RUN [--ticket T …]`.

1. The cancel is recorded in the run folder (run/cancels.py) and, for the whole run, the
   run ends stopped with the reason (exit 2 for its waiting command; `resume` goes on).
   From then on no task and no model request of the run (or of those tickets) starts,
   on any worker, also after every worker restarted.
2. It is delivered live (coordination/control.py): every worker process stops the run's steps it
   runs — their model requests are cut and their tools woken — and answers; the command
   waits for every answer. The run's waiting command, if any, is told it ended.

Without a broker to publish on (an embedded run, or no TICKETGRAPH_BROKER_URL here), the
run's own command, which watches the cancel folder while it waits, delivers it to its
workers and leaves a receipt; `cancel` waits for that receipt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from orchestrator.broker import outage
from orchestrator.coordination import control, events, keys
from orchestrator.errors import BrokerUnavailable, UsageError
from orchestrator.exit_codes import ExitCode
from orchestrator.run import cancels, ending, lease, totals
from orchestrator.run.records import Cancel, RunStatus, TicketStatus
from orchestrator.run.store import RunStore

RUN_ENDED = "run_cancelled"  # the trace event of a whole run cancelled
RECEIPT = ".delivered"  # cancel/<name>.delivered: the run's own command delivered it
RECEIPT_POLL_S = 0.05
_UNDER_WAY = (TicketStatus.CLAIMED, TicketStatus.ROUTED, TicketStatus.DRAFTED)


@dataclass
class Outcome:
    """What a cancel did: what it recorded, skipped, and how far it was delivered."""

    recorded: list[Cancel] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # ticket -> why it was not
    finished: str | None = None  # the run had ended with this verdict: nothing changed
    delivery: control.Delivery | None = None  # through the broker
    relayed: bool = False  # by the run's own command
    undelivered: str | None = None  # why running steps may not have heard it
    again: bool = False  # it had been cancelled before: delivered again, nothing else changed


def cancel(
    store: RunStore,
    tickets: list[str],
    by: str,
    reason: str,
    broker_url: str | None,
    wait_s: float,
) -> Outcome:
    """Cancel the run (no `tickets`) or those tickets; see the module's text."""
    records = store.tickets() if tickets else {}
    for ticket in tickets:
        if ticket not in records:
            raise UsageError(f"run {store.run_id} has no ticket {ticket}")
    meta = store.meta()
    if meta.status is RunStatus.DONE:
        return Outcome(finished=f"exit {meta.exit_code}")
    outcome = Outcome()
    if tickets:
        for ticket in tickets:
            if records[ticket].status not in _UNDER_WAY:
                outcome.skipped[ticket] = f"it is {records[ticket].status.value} already"
        targets: list[str | None] = [t for t in tickets if t not in outcome.skipped]
    else:
        targets = [None]
    outcome.again = all(cancels.of(store.dir, t, whole_run=False) for t in targets)
    outcome.recorded = [cancels.record(store, t, by, reason) for t in targets]
    if not outcome.recorded:
        return outcome
    whole = outcome.recorded[0].ticket is None
    if whole:
        ending.cancelled(store, outcome.recorded[0], RUN_ENDED)
    else:
        for made in outcome.recorded:
            store.tracer(node="cancel", ticket=made.ticket).emit("cancelled", why=made.why)
    named = None if whole else [c.ticket for c in outcome.recorded if c.ticket]
    why = outcome.recorded[0].why
    if broker_url:
        outcome.delivery = _publish(store, broker_url, named, why, wait_s, whole)
        for made in outcome.recorded:
            _receipt(store.dir, made.ticket).touch()
    else:
        _wait_for_relay(store, outcome, wait_s)
    if whole:  # what ran has stopped and recorded what it paid: the run's totals count it
        totals.recount_quietly(store)
    return outcome


def _publish(
    store: RunStore,
    broker_url: str,
    tickets: list[str] | None,
    why: str,
    wait_s: float,
    whole: bool,
) -> control.Delivery:
    r = keys.client(broker_url)

    def deliver() -> control.Delivery:
        delivery = control.publish(r, store.run_id, tickets, why, wait_s)
        if whole:  # the run's waiting command ends its wait at once (exit 2)
            events.publish(r, store.run_id, "run_end", exit_code=int(ExitCode.STOPPED))
        return delivery

    try:
        return outage.call(deliver, min(wait_s, 5.0), "delivering the cancel")
    except outage.BROKER_ERRORS as exc:
        raise BrokerUnavailable(
            f"the cancel is recorded in {store.dir} (no new model request of the run starts), "
            f"but the broker could not be reached to stop what runs now ({exc}); run the same "
            "command again to deliver it"
        ) from exc


def _wait_for_relay(store: RunStore, outcome: Outcome, wait_s: float) -> None:
    """No broker here: wait for the run's own command to deliver the cancel, if it lives."""
    if lease.holder(store) is None:
        outcome.undelivered = (
            "no command of this run is alive to deliver it, and no broker is configured "
            "here (TICKETGRAPH_BROKER_URL or --broker)"
        )
        return
    receipts = [_receipt(store.dir, c.ticket) for c in outcome.recorded]
    deadline = time.monotonic() + wait_s
    while not all(r.exists() for r in receipts):
        if time.monotonic() > deadline:
            outcome.undelivered = f"the run's command did not confirm it within {wait_s:g} s"
            return
        time.sleep(RECEIPT_POLL_S)
    outcome.relayed = True


def _receipt(run_dir: Path, ticket: str | None) -> Path:
    return run_dir / cancels.FOLDER / f"{ticket or cancels.WHOLE_RUN}{RECEIPT}"


class Relay:
    """The waiting command's side: deliver, to its own broker's workers, each cancel of its
    run that nobody delivered yet (one made without a broker at hand), and leave a
    receipt. Looked at once per event or quiet second: one folder listing."""

    def __init__(self, store: RunStore, r: redis.Redis) -> None:
        self.store, self.r = store, r
        self.done: set[str] = set()

    def deliver(self, wait_s: float = 2.0) -> None:
        """Deliver what is new; a broker error is left for the next look."""
        for made in cancels.all_of(self.store.dir):
            name = made.ticket or cancels.WHOLE_RUN
            receipt = _receipt(self.store.dir, made.ticket)
            if name in self.done or receipt.exists():
                self.done.add(name)
                continue
            tickets = None if made.ticket is None else [made.ticket]
            try:
                control.publish(self.r, self.store.run_id, tickets, made.why, wait_s)
            except outage.BROKER_ERRORS:
                return
            receipt.touch()
            self.done.add(name)
