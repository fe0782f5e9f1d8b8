"""draft: one ticket's first reply, by its category's worker (a harness agent with the
category's prompt and tools) or, for a category without one, the template; left in the run
folder for merge."""

from __future__ import annotations

from pathlib import Path

from orchestrator.run.records import StepUsage, TicketStatus
from orchestrator.steps import agent, prompts, routing
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.catalogs import tools_for
from orchestrator.steps.context import Context
from workers.trace import Tracer


def draft(ctx: Context, ticket_id: str) -> str:
    """Draft one ticket; a worker that gives no answer is the ticket's verdict."""
    ticket = ctx.store.ticket(ticket_id)
    trace = ctx.tracer(ticket=ticket_id)
    category = ticket.category or routing.OTHER
    if category not in prompts.WORKERS:
        trace.emit("template_done")
        text = prompts.OTHER_TEMPLATE.format(ticket_id=ticket_id)
        return _drafted(ctx, ticket_id, text, "template", StepUsage())
    handler = f"worker:{category}"
    task = prompts.draft_input(ticket_id, ctx.ticket_text(ticket_id))
    result = worker(ctx, ticket_id, category, "draft", task, trace)
    if not result.ok:
        error = result.error or "no draft"
        return ctx.fail_ticket(
            ticket_id, error, handler, result.usage, result.retryable, result.stop
        )
    trace.emit("worker_done", round=1, calls=result.usage.calls, tokens=result.usage.tokens)
    return _drafted(ctx, ticket_id, result.text or "", handler, result.usage, result.unsure_writes)


def _drafted(
    ctx: Context,
    ticket_id: str,
    text: str,
    handler: str,
    usage: StepUsage,
    unsure_writes: list[str] | None = None,
) -> str:
    """Leave the draft in the run folder for merge, and mark the ticket drafted."""
    ctx.store.write(ctx.store.draft_path(ticket_id), text.strip() + "\n")
    ticket = ctx.store.ticket(ticket_id)
    ticket.handler, ticket.draft, ticket.status = handler, usage, TicketStatus.DRAFTED
    ticket.unsure_writes = list(unsure_writes or [])
    ctx.store.save_ticket(ticket_id, ticket)
    return ticket.status.value


def worker(
    ctx: Context, ticket_id: str, category: str, name: str, task: str, trace: Tracer
) -> AgentResult:
    """One run of the category's worker about `ticket_id` (its agent state: `<ticket>.<name>`),
    with the category's tools; review's rewrites use it too."""
    tools = tools_for(
        category,
        Path(ctx.meta.workspace),
        ctx.meta.config.reads,
        (ctx.store.actions_path, ticket_id),
    )
    system = prompts.WORKERS[category]
    path = ctx.store.agent_path(ticket_id, name)
    return agent.run_agent(ctx, category, system, task, path, trace, tools)
