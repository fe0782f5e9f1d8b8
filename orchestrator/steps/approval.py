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

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import ConfigError, UsageError
from orchestrator.run import approvals
from orchestrator.run.records import WorkerSpec
from orchestrator.steps.context import Context
from workers.errors import ToolError
from workers.state import Interruption, RunState, ToolCall, approve, pending, reject
from workers.tools import Catalog, Tool
from workers.trace import now_iso

ALWAYS, NEVER = "always", "never"

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def check(rule: str, names: set[str] | None = None) -> None:
    """`ConfigError` if `rule` is not a rule this module can evaluate (or, with `names`,
    names an argument the tool does not take)."""
    if rule in (ALWAYS, NEVER) or is_import_path(rule):
        return
    try:
        tree = ast.parse(rule, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"approval rule {rule!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            kind = type(node).__name__
            raise ConfigError(f"approval rule {rule!r}: {kind} is not allowed in a rule")
        if names is not None and isinstance(node, ast.Name) and node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"approval rule {rule!r} names {node.id!r}; the tool takes {known}")


Functions = dict[str, Callable[[dict[str, Any]], Any]]  # import path -> the rule's function


def needs_person(rule: str, args: dict[str, Any], functions: Functions | None = None) -> bool:
    """Whether a call with `args` must wait for a person under `rule` (`functions`: the
    workspace's rule functions, imported by config/declarations.py)."""
    if rule == ALWAYS:
        return True
    if rule == NEVER:
        return False
    if is_import_path(rule):
        function = (functions or {}).get(rule)
        if function is None:
            raise ConfigError(f"approval rule {rule!r}: its function was not imported")
        return bool(function(dict(args)))
    try:
        return bool(_eval(ast.parse(rule, mode="eval").body, args))
    except (TypeError, KeyError, ValueError):
        return True  # a rule that cannot be evaluated on these arguments: a person decides


_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.Compare,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.List,
    ast.Tuple,
    *_COMPARE,
)


def _eval(node: ast.AST, args: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return args[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, args) for e in node.elts]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, args)
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, args) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, args)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, args)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"{type(node).__name__} in a rule")


def is_import_path(rule: str) -> bool:
    module, _, name = rule.partition(":")
    return bool(module) and name.isidentifier() and all(p.isidentifier() for p in module.split("."))


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
