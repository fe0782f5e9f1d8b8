"""What a step needs (the run's files, the model endpoint, a cancel token, the node it
records), and the few things every step does with its node and its tickets.

A step's node is its line in run-state.json, the trace and the report (`nodes/<node>.json`).
A whole-run step opens and closes its own node; a per-ticket step's node is opened by the
first of its tasks and closed, with the sum of its tickets' usage, by the step after it
(plan/tasks.py), so no ticket's task ever writes a record another ticket's task writes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from orchestrator.run import approvals
from orchestrator.run.records import (
    NodeRecord,
    RunMeta,
    RunStatus,
    StepUsage,
    TicketRecord,
    TicketStatus,
    WaitingCall,
)
from orchestrator.run.store import RunStore
from workers.cancel import CancelToken
from workers.settings import HarnessSettings
from workers.state import Interruption
from workers.trace import Tracer, now_iso


@dataclass(frozen=True)
class Stop:
    """What a whole-run step returns when the run must stop there, resumable (exit 2), for
    `why`; the task layer ends the run (plan/tasks.py)."""

    why: str


# What a whole-run step returns: the tickets the per-ticket step after it takes, a `Stop`,
# or (the last step) the exit code of the run's verdict.
Follows = list[str] | Stop | int


@dataclass
class Context:
    """One step's view of a run: its files (written through the task's fence), this worker's
    model endpoint, the token that stops its agents (the soft time limit sets it), and the
    step's name and the node it records."""

    store: RunStore
    llm: HarnessSettings
    step: str = "run"
    node: str = "run"
    cancel: CancelToken = field(default_factory=CancelToken)
    # The broker's Redis, where the run's budget ledger is (None: no ledger, no budget).
    redis: redis.Redis | None = None

    # run.json's version when `meta` read it (RunStore.meta_version).
    _meta_read: tuple[int, int, int] | None = field(default=None, init=False, repr=False)
    # Events about a ticket's record that the trace gets once the task saved it (`told`).
    _untold: list[tuple[str, str, dict[str, object]]] = field(
        default_factory=list, init=False, repr=False
    )

    @functools.cached_property
    def meta(self) -> RunMeta:
        """run.json as this step found it (config, workspace)."""
        self._meta_read = self.store.meta_version()  # first: a write meanwhile looks changed
        return self.store.meta()

    def run_ended(self) -> bool:
        """True if the run is no longer running. While it runs, one stat of run.json: it is
        read again only if it changed since `meta` read it."""
        seen = self.__dict__.get("meta")  # read by this step (cached_property's slot)
        running = seen is not None and seen.status is RunStatus.RUNNING
        if running and self._meta_read is not None and self._meta_read == self.store.meta_version():
            return False
        return self.store.meta().status is not RunStatus.RUNNING

    def tracer(self, **fields: object) -> Tracer:
        """A tracer for this run with the step's node (and any `fields`) on every line."""
        return self.store.tracer(node=self.node, **fields)

    def tell(self, ticket_id: str, event: str, **fields: object) -> None:
        """Trace `event` about the ticket once its record is saved (`told`): whoever reads
        the trace finds the record saying so."""
        self._untold.append((ticket_id, event, fields))

    def untold(self) -> None:
        """Forget the events of a record that will not be saved (its step failed)."""
        self._untold.clear()

    def told(self) -> None:
        """Trace the events the step kept for after its record was saved (the task saved it)."""
        untold, self._untold[:] = list(self._untold), []
        for ticket_id, event, fields in untold:
            self.tracer(ticket=ticket_id).emit(event, **fields)

    def ticket_text(self, ticket_id: str) -> str:
        """The ticket's text as claimed into the run folder."""
        return self.store.ticket_text(ticket_id)

    # --- the step's node --------------------------------------------------------------------

    def node_done(self) -> bool:
        """True once this step's node has been closed (the step finished before)."""
        record = self.store.node(self.node)
        return record is not None and record.done

    def open_node(self) -> None:
        """Open the node once per run (whoever gets here first), tracing node_start."""
        if self.store.open_node(self.node, NodeRecord(started=time.time())):
            self.tracer().emit("node_start")

    def close_node(self, usage: StepUsage | None = None, rounds: int | None = None) -> None:
        """Close the node with its totals (unless closed already) and trace node_end."""
        record = self.store.node(self.node) or NodeRecord(started=time.time())
        if record.done:
            return
        usage = usage or StepUsage()
        record.close(usage.calls, usage.tokens, rounds, usage=usage)
        self.store.save_node(self.node, record)
        self.tracer().emit("node_end", ms=record.ms, calls=record.calls, tokens=record.tokens)

    # --- a ticket's failure -----------------------------------------------------------------

    def failed(
        self,
        ticket_id: str,
        ticket: TicketRecord,
        error: str,
        handler: str | None = None,
        usage: StepUsage | None = None,
        retryable: bool = True,
        stop: str = "worker_failed",
    ) -> TicketRecord:
        """The ticket's record with its failure in this step as its verdict; the batch goes
        on. `retryable`: `resume` tries it again (a provider outage, a crash of ours, a time
        limit); `stop`: worker_failed, time_limit, max_turns or budget."""
        ticket.handler = handler or ticket.handler
        ticket.error, ticket.stop, ticket.status = error, stop, TicketStatus.NEEDS_HUMAN
        ticket.retryable, ticket.stopped_in = retryable, self.step
        ticket.spend(self.step, usage or StepUsage())
        self.tell(ticket_id, stop, error=error)
        return ticket

    def wait_for_person(
        self,
        ticket_id: str,
        ticket: TicketRecord,
        call: Interruption,
        handler: str | None,
        usage: StepUsage,
    ) -> TicketRecord:
        """The ticket's record once its worker stopped for a call a person must decide: the
        request in approvals/, the ticket `awaiting_approval` (its slot goes to the next one);
        `resume` takes it up in this step once the call is decided."""
        args = dict(call.args or {})
        # A decision already on this call id was made for an earlier call under the same
        # id (another agent run of the ticket numbered its calls alike): never this one's.
        why = "it was made for an earlier call under the same id"
        approvals.set_aside(self.store, ticket_id, call.call_id or "", why)
        request = approvals.Request(
            run_id=self.store.run_id,
            ticket=ticket_id,
            call_id=call.call_id or "",
            tool=call.tool or "",
            args=args,
            args_hash=approvals.args_hash(args),
            asked_at=now_iso(),
            step=self.step,
        )
        approvals.ask(self.store, request)
        ticket.handler = handler or ticket.handler
        ticket.status, ticket.stop = (
            TicketStatus.AWAITING_APPROVAL,
            TicketStatus.AWAITING_APPROVAL.value,
        )
        ticket.stopped_in, ticket.error = self.step, None
        ticket.waiting = WaitingCall(
            call_id=request.call_id,
            tool=request.tool,
            args=args,
            args_hash=request.args_hash,
            asked_at=request.asked_at,
        )
        ticket.spend(self.step, usage)
        self.tell(
            ticket_id, "awaiting_approval", call_id=request.call_id, tool=request.tool, args=args
        )
        return ticket


def fan_in(
    tickets: Iterable[TicketRecord], step: str, rounds: bool
) -> tuple[StepUsage, int | None]:
    """A per-ticket step's totals over its tickets (in one pass): usage, and gate rounds if
    it counts them."""
    usage, gate_rounds = StepUsage(), 0
    for t in tickets:
        usage, gate_rounds = usage + t.spent_in(step), gate_rounds + t.gate_rounds
    return usage, (gate_rounds if rounds else None)
