"""draft: one ticket's first reply, by its category's worker (a harness agent with the
prompt, tools and readable files its `[workers.<category>]` table declares) or, for a
category without one, its template; left in the run folder for merge."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.config import declarations
from orchestrator.config.workspace import Workspace
from orchestrator.run import ledger as effect_ledger
from orchestrator.run.records import StepUsage, TicketRecord, TicketStatus, Vote
from orchestrator.steps import agent, approval, prompts, routing, voting
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.context import Context
from workers.sandbox import Sandbox
from workers.tools import ToolScope
from workers.trace import Tracer

DRAFT = "draft"  # the draft's agent state: agents/<ticket>.draft.json


def draft(ctx: Context, ticket_id: str, ticket: TicketRecord) -> TicketRecord:
    """Draft one ticket: its record, drafted; a worker that gives no answer is the ticket's
    verdict."""
    trace = ctx.tracer(ticket=ticket_id)
    category = ticket.category or routing.OTHER
    config = ctx.meta.config
    if category not in config.workers:
        trace.emit("template_done")
        text = config.templates[category].format_map(_fields(ticket_id, ticket))
        return _drafted(ctx, ticket_id, ticket, text, "template", StepUsage())
    handler = f"worker:{category}"
    task = prompts.draft_input(ticket_id, ctx.ticket_text(ticket_id))
    result, vote = _drafts(ctx, ticket_id, category, task, trace)
    if result.waiting is not None:
        return ctx.wait_for_person(ticket_id, ticket, result.waiting, handler, result.usage)
    if not result.ok:
        error = result.error or "no draft"
        return ctx.failed(
            ticket_id, ticket, error, handler, result.usage, result.retryable, result.stop
        )
    trace.emit("worker_done", round=1, calls=result.usage.calls, tokens=result.usage.tokens)
    text, unsure = result.text or "", result.unsure_writes
    return _drafted(ctx, ticket_id, ticket, text, handler, result.usage, unsure, vote)


def _drafts(
    ctx: Context, ticket_id: str, category: str, task: str, trace: Tracer
) -> tuple[AgentResult, Vote | None]:
    """The worker's draft; a worker with angles drafts from each, and code votes."""
    if not ctx.meta.config.workers[category].angles:
        return worker(ctx, ticket_id, category, DRAFT, task, trace), None

    def draft_from(angle: str) -> AgentResult:
        return worker(ctx, ticket_id, category, voting.step(angle), task, trace, angle)

    return voting.vote(ctx, ticket_id, category, task, trace, draft_from)


def _drafted(
    ctx: Context,
    ticket_id: str,
    ticket: TicketRecord,
    text: str,
    handler: str,
    usage: StepUsage,
    unsure_writes: list[str] | None = None,
    vote: Vote | None = None,
) -> TicketRecord:
    """Leave the draft in the run folder for merge; the ticket's record, drafted (with the
    vote between its worker's angles, if it has them)."""
    ctx.store.write(ctx.store.draft_path(ticket_id), text.strip() + "\n")
    ticket.handler, ticket.draft, ticket.status = handler, usage, TicketStatus.DRAFTED
    ticket.unsure_writes, ticket.vote = list(unsure_writes or []), vote
    return ticket


def worker(
    ctx: Context,
    ticket_id: str,
    category: str,
    name: str,
    task: str,
    trace: Tracer,
    angle: str | None = None,
) -> AgentResult:
    """One run of the category's worker about `ticket_id` (its agent state: `<ticket>.<name>`),
    with its declared tools over its readable files, and its prompt (or `angle`'s); review's
    rewrites use it too."""
    spec = ctx.meta.config.workers[category]
    workspace = Workspace(Path(ctx.meta.workspace))
    declared = declarations.load(workspace, ctx.meta.config)
    made = effect_ledger.history(workspace, ticket_id, ctx.ticket_text(ticket_id), name)
    scope = ToolScope(ticket_id, Sandbox(workspace.root, spec.reads), _recorder(ctx), made.base())
    scope.ledger = effect_ledger.ledger(workspace, ctx.store.run_id, made, ctx.store.fence)
    if made.repeats:
        asked = effect_ledger.repeats(workspace, ticket_id).asked[-1]
        trace.emit("writes_repeat", agent=name, repeats=made.repeats, by=asked.by, at=asked.at)
    path = ctx.store.agent_path(ticket_id, name)
    policy = approval.gate(ctx, ticket_id, spec, declared.rule_functions)
    tools = declared.tools_of(spec)
    prompt = spec.prompt_of(angle)
    return agent.run_agent(ctx, category, prompt, task, path, trace, tools, scope, policy)


def _recorder(ctx: Context) -> Any:
    """Append one effect to the run's actions.jsonl (finance's queue, say), durably."""

    def record(effect: dict[str, Any]) -> None:
        with ctx.store.actions_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(effect, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    return record


def _fields(ticket_id: str, ticket: TicketRecord) -> dict[str, str]:
    """What a template may say of a ticket (config/layers.py checks the names)."""
    return {
        "ticket_id": ticket_id,
        "category": ticket.category or "",
        "subject": ticket.subject or "",
        "sender": ticket.sender or "",
    }
