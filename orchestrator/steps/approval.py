"""Approval policies: which tool calls of a worker wait for a person.

A worker's `approval` table maps a tool to what its calls need:

    "always"                 every call waits for a person
    "never"                  no call waits (the policy approves each, and says so)
    "amount_cents > 5000"    a rule on the call's arguments: a call for which it holds waits;
                             the others are approved by the policy
    "my_rules:refund_rule"   a function of the team's own, called with the arguments (a
                             dict): True when the call must wait

A rule is a small expression over the call's argument names: numbers and strings,
comparisons (`<`, `<=`, `>`, `>=`, `==`, `!=`, `in`, `not in`), `and`, `or`, `not` and
parentheses; nothing else (no calls, no attributes), so a ticket's text, which reaches the
arguments through the model, can never run code. A tool without an entry waits only if it
says so itself. Every approval a policy gives is recorded like a person's, with
`by = "policy"` and the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from orchestrator.config.policy import Functions, needs_person
from orchestrator.errors import UsageError
from orchestrator.run import approvals
from orchestrator.run.records import WorkerSpec
from orchestrator.steps.context import Context
from workers.errors import ToolError
from workers.state import Interruption, RunState, ToolCall, approve, pending, reject
from workers.tools import Catalog, Tool
from workers.trace import now_iso

# --- the graph's side: a worker's calls under its policy, and decisions brought back ----------


def gate(
    ctx: Context, ticket_id: str, worker: WorkerSpec, functions: Functions | None = None
) -> Callable[[Tool, BaseModel, str], bool]:
    """Whether a call of this worker may run now (the harness asks before every call that a
    person has not approved): its tool's rule decides, and an approval the policy gives is
    recorded like a person's. A call that must wait makes the agent stop for approval."""

    def may_run(tool: Tool, args: BaseModel, call_id: str) -> bool:
        rule = worker.approval.get(tool.name)
        if rule is None:
            return not tool.needs_approval
        values = args.model_dump()
        if needs_person(rule, values, functions):
            return False
        digest = approvals.args_hash(values)
        earlier = approvals.decision(ctx.store, ticket_id, call_id)
        if earlier is not None:
            # An approval is for the arguments it was made for, never for another call
            # under the same id: that one waits for a person.
            return earlier.approved and earlier.args_hash == digest
        made = approvals.Decision(
            ticket=ticket_id,
            call_id=call_id,
            tool=tool.name,
            args_hash=digest,
            approved=True,
            by=approvals.POLICY,
            at=now_iso(),
            rule=rule,
        )
        try:
            approvals.record(ctx.store, made)
        except UsageError:  # a decision file that cannot be read is there: a person decides
            return False
        trace = ctx.tracer(ticket=ticket_id)
        trace.emit("approved", call_id=call_id, tool=tool.name, by=approvals.POLICY, rule=rule)
        return True

    return may_run


@dataclass
class Unapplied:
    """A decision `bring_back` did not apply, and why: the call waits again (`again`, as the
    agent has it now), or it expired (`again` is None)."""

    why: str
    again: Interruption | None = None


def bring_back(ctx: Context, ticket_id: str, state: RunState, catalog: Catalog) -> Unapplied | None:
    """Apply the decision on the call `state` stopped for, if one was made: the call runs
    on resume (approved), or the model is told it was declined, with the reason. A decision
    that does not count (approvals.standing), or was made for other arguments than the
    call has now (the transcript changed), is set aside and the call waits again; one made
    after the call expired is not applied either."""
    interruption = state.interruption
    if interruption is None or interruption.type != "approval" or interruption.call_id is None:
        return None
    call = _pending_call(state, interruption.call_id)
    asked = approvals.request(ctx.store, ticket_id, interruption.call_id)
    if call is None or asked is None:
        return None  # nothing waits for it: the loop goes on (and asks, if it must)
    found = approvals.standing(ctx.store, asked, approvals.expire_s(ctx.meta.config))
    if found.expired:
        return Unapplied(found.void or f"call {asked.call_id} waited past its expiry undecided")
    try:
        args = catalog.get(call.function.name).parse(call.function.arguments).model_dump()
    except ToolError:
        return None  # the loop answers it with the error; nothing runs
    decided, why = found.decided, found.void
    if decided is not None and approvals.args_hash(args) != decided.args_hash:
        decided, why = None, "it was made for other arguments than the call has now"
    if why is not None:
        approvals.set_aside(ctx.store, ticket_id, asked.call_id, why)
        again = Interruption(type="approval", call_id=call.id, tool=call.function.name, args=args)
        return Unapplied(f"the decision on call {call.id} is set aside: {why}", again)
    if decided is not None:
        _apply(ctx, ticket_id, state, decided)
    return None  # applied, or undecided (the loop stops for it again)


def _apply(ctx: Context, ticket_id: str, state: RunState, decided: approvals.Decision) -> None:
    if decided.approved:
        approve(state, decided.call_id)
    else:
        reject(state, decided.call_id, decided.reason)
    verdict = "approved" if decided.approved else "rejected"
    trace = ctx.tracer(ticket=ticket_id)
    trace.emit(verdict, call_id=decided.call_id, tool=decided.tool, by=decided.by)


def _pending_call(state: RunState, call_id: str) -> ToolCall | None:
    """The call `call_id` if it is still unanswered in the transcript."""
    return next((c for c in pending(state) if c.id == call_id), None)
