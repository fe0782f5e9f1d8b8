"""route: the router classifies every claimed ticket (its labels clamped to the known
categories), in batches that fit the model (steps/batches.py), asked concurrently; tickets
a reply left out are asked about again in smaller batches, down to one ticket a call, and
one still not named then needs a human (stop `unrouted`), never a template reply.

Every call is a harness agent run with its own saved state (`agents/_router.<name>.json`),
so a resumed route replays the calls it made, pays only for those it had not, and so plans
the same re-asks from the same replies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from orchestrator.config.workspace import DEMO_SCENARIOS
from orchestrator.errors import RouteFailed
from orchestrator.intake import inbox
from orchestrator.run.records import Routed, StepUsage, TicketRecord, TicketStatus
from orchestrator.run.store import ROUTER, RunStore
from orchestrator.steps import agent, batches, prompts, routing
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.context import Context, Stop
from workers.state import AgentStatus
from workers.trace import Tracer

UNROUTED = "unrouted"  # the stop of a ticket the router named no category for, alone too


def route(ctx: Context) -> list[str] | Stop:
    """Route every claimed ticket; return the tickets drafting should take (a `Stop` when
    the run's budget cannot pay for a call)."""
    if ctx.node_done():
        return [i for i, t in ctx.store.records() if t.status is TicketStatus.ROUTED]
    ids = ctx.store.ticket_ids()
    trace = ctx.tracer()
    ctx.open_node()
    asked = _Asking(ctx, ids, trace).all()
    if isinstance(asked, AgentResult):
        return _out_of_budget(ctx, asked)
    decisions = asked.decisions
    routes = {
        i: Routed(category=d.category, routing=d.how, routed_as=d.raw)
        for i, d in decisions.items()
        if d.category is not None
    }
    ctx.store.save_routes(routes)  # drafting writes each into the ticket's record
    unrouted = [i for i in ids if i in decisions and i not in routes]
    scripted = ctx.meta.config.scripted
    errors = {i: unrouted_error(i, scripted, asked.asks[i]) for i in unrouted}
    ctx.store.save_tickets(_unrouted(ctx, errors))
    with trace.batched() as lines:
        for ticket_id in ids:
            if (routed := routes.get(ticket_id)) is not None:
                lines.emit("routed", ticket=ticket_id, category=routed.category)
            elif ticket_id in errors:
                lines.emit(UNROUTED, ticket=ticket_id, error=errors[ticket_id])
                status = TicketStatus.NEEDS_HUMAN.value
                lines.emit("verdict", ticket=ticket_id, stop=UNROUTED, status=status)
    ctx.close_node(asked.usage)
    ctx.store.materialise()
    return [i for i in ids if i in routes]


def _texts(store: RunStore, ids: list[str], chars: int) -> dict[str, str]:
    """Each ticket's text as the router is shown it (its first `chars` characters)."""
    return {i: inbox.route_text(store.ticket_text(i), chars) for i in ids}


@dataclass
class Asked:
    """What the router's calls decided, what they cost, and how often each ticket was asked."""

    decisions: dict[str, routing.Decision] = field(default_factory=dict)
    usage: StepUsage = field(default_factory=StepUsage)
    asks: Counter[str] = field(default_factory=Counter)


class _Asking:
    """The router's rounds over one run's tickets: the batches that fit, then the tickets
    each reply left out, in batches half the size of the largest one before."""

    def __init__(self, ctx: Context, ids: list[str], trace: Tracer) -> None:
        config = ctx.meta.config
        self.ctx, self.ids, self.trace = ctx, ids, trace
        self.texts = _texts(ctx.store, ids, config.route_chars)
        self.system = prompts.ROUTER.format(categories=agent.categories_text(config))
        self.batching = batches.for_run(config, self.texts)

    def all(self) -> Asked | AgentResult:
        """Ask until every ticket is named or was left out when asked alone (twice at
        least); an `AgentResult` that ran out of the run's budget stops it."""
        asked, todo, round_ = Asked(), self.batching.plan(self.ids), 0
        while todo:
            results = self._round(todo, round_)
            for _, result in results:
                asked.usage = asked.usage + result.usage
            if (stopped := next((r for _, r in results if r.out_of_budget), None)) is not None:
                return stopped
            again: list[str] = []
            with self.trace.batched() as lines:
                for batch, result in results:
                    asked.asks.update(batch)
                    text, categories = _text(result, round_), self.ctx.meta.config.categories
                    found = _decide(text, self.ids, batch, categories, lines)
                    asked.decisions |= found
                    left = [i for i in batch if found[i].how == "missing"]
                    again += [i for i in left if len(batch) > 1 or asked.asks[i] < 2]
            half = max(1, max(len(b) for b in todo) // 2)
            todo, round_ = self.batching.plan(again, most=half), round_ + 1
        return asked

    def _round(self, todo: list[list[str]], round_: int) -> list[tuple[list[str], AgentResult]]:
        """One call a batch, at most the run's pool size at once (the endpoint's caps and
        the run's budget hold each call as they hold a draft's); in batch order."""
        names = [_name(round_, k) for k in range(len(todo))]
        if len(todo) == 1:
            return [(todo[0], self._ask(todo[0], names[0], self.trace))]
        workers = min(len(todo), self.ctx.meta.config.pool_size)
        with ThreadPoolExecutor(workers, thread_name_prefix="route") as pool:
            futures = [
                pool.submit(self._ask, batch, name, self.trace.bind(batch=name))
                for batch, name in zip(todo, names, strict=True)
            ]
        return [(batch, f.result()) for batch, f in zip(todo, futures, strict=True)]

    def _ask(self, batch: list[str], name: str, trace: Tracer) -> AgentResult:
        """One routing call about `batch` (its agent state: `_router.<name>`)."""
        return agent.run_agent(
            self.ctx,
            "router",
            self.system,
            prompts.router_input([(i, self.texts[i]) for i in batch]),
            self.ctx.store.agent_path(ROUTER, name),
            trace,
        )


def _text(result: AgentResult, round_: int) -> str:
    """The reply to read (an empty one names no ticket; one cut off at max_tokens is read
    as far as it goes); a call that failed raises `RouteFailed` unless it was a re-ask that
    a retry cannot mend, whose tickets count as left out."""
    if result.status is AgentStatus.COMPLETED:
        return result.text or ""
    if result.cut_off is not None:  # its last line may stop mid-label: it is asked again
        return result.cut_off.rpartition("\n")[0]
    if round_ == 0:
        again = "resume retries it" if result.retryable else "fix it, then resume with "
        again += "" if result.retryable else "--retry-failed all"
        raise RouteFailed(f"the router did not answer: {result.error} ({again})")
    if result.retryable:  # resume asks again (the calls before were paid)
        raise RouteFailed(f"the router did not answer again: {result.error} (resume retries it)")
    return ""


def _name(round_: int, k: int) -> str:
    """The agent state name of batch `k` of a round: `route`, `route-b2`, …; the first
    re-asks `route-again`, `route-again-b2`, …; the later ones `route-again2`, …"""
    base = "route" if round_ == 0 else "route-again" if round_ == 1 else f"route-again{round_}"
    return base if k == 0 else f"{base}-b{k + 1}"


def _unrouted(ctx: Context, errors: dict[str, str]) -> Iterator[tuple[str, TicketRecord]]:
    """The records of the tickets the router named no category for, with their verdict (a
    person), one at a time as they are written."""
    for ticket_id, error in errors.items():
        ticket = ctx.store.ticket(ticket_id)
        ticket.routing, ticket.error = "missing", error
        ticket.status, ticket.stop = TicketStatus.NEEDS_HUMAN, UNROUTED
        yield ticket_id, ticket


def _out_of_budget(ctx: Context, result: AgentResult) -> Stop:
    """A router's call was not started for want of budget: the run stops (exit 2), and
    `resume --budget <more>` routes it, paying only for what was not done."""
    return Stop(f"{result.error}; resume with a higher --budget")


def unrouted_error(ticket_id: str, scripted: bool, asks: int) -> str:
    """Why a ticket the router named no category for needs a person; with the workspace's
    scripted replies, the line their router's reply lacks and where it goes."""
    times = {1: "once", 2: "twice"}.get(asks, f"{asks} times")
    alone = "" if asks <= 2 else ", the last time alone"
    why = f"the router named no category for it, asked {times}{alone}"
    if not scripted:
        return why
    return (
        f"{why} (the router's reply in the workspace's {DEMO_SCENARIOS} has no line "
        f"`{ticket_id}: <category>`: requeue the ticket, run `ticketgraph scenarios init` and "
        "fill in what it adds; or set LLM_BASE_URL to route with a real model)"
    )


def parse(text: str, ids: list[str], allowed: list[str], trace: Tracer) -> dict[str, str]:
    """Claimed id -> category from the router's reply ('' if none); each decision traced."""
    return {i: d.category or "" for i, d in _decide(text, ids, ids, allowed, trace).items()}


def _decide(
    text: str, ids: list[str], asked: list[str], allowed: list[str], trace: Tracer
) -> dict[str, routing.Decision]:
    """The decisions about `asked` (of the run's claimed `ids`), each traced; lines about
    ids the run did not claim are ignored, and counted."""
    routes = routing.parse(text, ids, allowed)
    decisions = {i: routes.decisions[i] for i in asked}
    for ticket_id, decision in decisions.items():
        if decision.how == "clamped":
            trace.emit("clamped", ticket=ticket_id, raw=decision.raw, category=decision.category)
        elif decision.how == "missing":
            trace.emit("route_missing", ticket=ticket_id)
    if routes.unclaimed:
        trace.emit("unclaimed", tickets=routes.unclaimed, lines=routes.unclaimed_lines)
    return decisions
