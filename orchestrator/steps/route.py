"""route: one model call classifies every claimed ticket (its labels clamped to the known
categories); tickets the reply did not name are asked about once more, and those still not
named need a human (stop `unrouted`), never a template reply."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.errors import RouteFailed
from orchestrator.intake import inbox
from orchestrator.run import ending
from orchestrator.run.records import Routed, TicketRecord, TicketStatus
from orchestrator.run.store import ROUTER
from orchestrator.steps import agent, prompts, routing
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.context import Context
from orchestrator.workspace import DEMO_SCENARIOS
from workers.trace import Tracer

UNROUTED = "unrouted"  # the stop of a ticket the router named no category for, twice


def route(ctx: Context) -> list[str]:
    """Route every claimed ticket; return the tickets drafting should take."""
    if ctx.node_done():
        return [i for i, t in ctx.store.records() if t.status is TicketStatus.ROUTED]
    ids = ctx.store.ticket_ids()
    trace = ctx.tracer()
    ctx.open_node()
    categories = ctx.meta.config.categories
    result = _ask(ctx, ids, "route", trace)
    if result.out_of_budget:
        return _out_of_budget(ctx, result)
    if not result.ok:
        again = (
            "resume retries it"
            if result.retryable
            else "fix it, then resume with --retry-failed all"
        )
        raise RouteFailed(f"the router did not answer: {result.error} ({again})")
    with trace.batched() as lines:  # a line per ticket: appended together
        decisions = _decide(result.text or "", ids, ids, categories, lines)
    usage = result.usage
    if missing := [i for i, d in decisions.items() if d.how == "missing"]:
        second = _ask(ctx, missing, "route-again", trace)
        usage = usage + second.usage
        if second.out_of_budget:
            return _out_of_budget(ctx, second)
        if not second.ok and second.retryable:  # resume asks again (the first is paid)
            raise RouteFailed(
                f"the router did not answer again: {second.error} (resume retries it)"
            )
        if second.ok:
            with trace.batched() as lines:
                found = _decide(second.text or "", ids, missing, categories, lines)
            decisions |= {i: d for i, d in found.items() if d.how != "missing"}
    routes = {
        i: Routed(category=d.category, routing=d.how, routed_as=d.raw)
        for i, d in decisions.items()
        if d.category is not None
    }
    ctx.store.save_routes(routes)  # drafting writes each into the ticket's record
    unrouted = [i for i in ids if i in decisions and i not in routes]
    scripted = ctx.meta.config.scripted
    ctx.store.save_tickets(_unrouted(ctx, unrouted, scripted))
    with trace.batched() as lines:
        for ticket_id in ids:
            if (routed := routes.get(ticket_id)) is not None:
                lines.emit("routed", ticket=ticket_id, category=routed.category)
            elif ticket_id in decisions:
                lines.emit(UNROUTED, ticket=ticket_id, error=unrouted_error(ticket_id, scripted))
                status = TicketStatus.NEEDS_HUMAN.value
                lines.emit("verdict", ticket=ticket_id, stop=UNROUTED, status=status)
    ctx.close_node(usage)
    if ctx.meta.config.stop_after == "route":
        ending.stop_early(ctx.store)
        return []
    ctx.store.materialise()
    return [i for i in ids if i in routes]


def _unrouted(
    ctx: Context, unrouted: list[str], scripted: bool
) -> Iterator[tuple[str, TicketRecord]]:
    """The records of the tickets the router named no category for, twice, with their
    verdict (a person), one at a time as they are written."""
    for ticket_id in unrouted:
        ticket = ctx.store.ticket(ticket_id)
        ticket.routing, ticket.error = "missing", unrouted_error(ticket_id, scripted)
        ticket.status, ticket.stop = TicketStatus.NEEDS_HUMAN, UNROUTED
        yield ticket_id, ticket


def _out_of_budget(ctx: Context, result: AgentResult) -> list[str]:
    """The router's call was not started for want of budget: the run stops (exit 2), and
    `resume --budget <more>` routes it, paying only for what was not done."""
    ending.stopped(ctx.store, f"{result.error}; resume with a higher --budget")
    return []


def unrouted_error(ticket_id: str, scripted: bool) -> str:
    """Why a ticket the router named no category for needs a person; with the workspace's
    scripted replies, the line their router's reply lacks and where it goes."""
    why = "the router named no category for it, asked twice"
    if not scripted:
        return why
    return (
        f"{why} (the router's reply in the workspace's {DEMO_SCENARIOS} has no line "
        f"`{ticket_id}: <category>`: requeue the ticket, run `ticketgraph scenarios init` and "
        "fill in what it adds; or set LLM_BASE_URL to route with a real model)"
    )


def _ask(ctx: Context, ids: list[str], name: str, trace: Tracer) -> AgentResult:
    """One routing call about `ids` (its agent state: `_router.<name>`)."""
    config = ctx.meta.config
    text = [(i, inbox.route_text(ctx.ticket_text(i), config.route_chars)) for i in ids]
    return agent.run_agent(
        ctx,
        "router",
        prompts.ROUTER.format(categories=agent.categories_text(config)),
        prompts.router_input(text),
        ctx.store.agent_path(ROUTER, name),
        trace,
    )


def parse(text: str, ids: list[str], allowed: list[str], trace: Tracer) -> dict[str, str]:
    """Claimed id -> category from the router's reply ('' if none); each decision traced."""
    return {i: d.category or "" for i, d in _decide(text, ids, ids, allowed, trace).items()}


def _decide(
    text: str, ids: list[str], asked: list[str], allowed: list[str], trace: Tracer
) -> dict[str, routing.Decision]:
    """The decisions about `asked` (of the run's claimed `ids`), each traced."""
    routes = routing.parse(text, ids, allowed)
    decisions = {i: routes.decisions[i] for i in asked}
    for ticket_id, decision in decisions.items():
        if decision.how == "clamped":
            trace.emit("clamped", ticket=ticket_id, raw=decision.raw, category=decision.category)
        elif decision.how == "missing":
            trace.emit("route_missing", ticket=ticket_id)
    if routes.unclaimed:
        trace.emit("unclaimed", tickets=routes.unclaimed)
    return decisions
