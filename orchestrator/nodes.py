"""The five nodes as plain functions over a run folder. Celery tasks only call these.

Every node is idempotent per run and ticket: it reads the record, skips work already done,
and persists after each small step, so a resumed run never pays for a finished step again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator import gate, prompts, report
from orchestrator.agents import AgentResult, run_agent
from orchestrator.errors import RouteFailed
from orchestrator.exit_codes import ExitCode
from orchestrator.runstate import RunPhase, RunRecord, RunStore, StepUsage, TicketStatus
from orchestrator.toolbox import tools_for
from workers import atomic
from workers.settings import HarnessSettings
from workers.trace import Tracer

ROUTE_LINE = re.compile(r"^\s*([^\s:]+)\s*:\s*(\S+)\s*$")
OTHER = "other"


@dataclass
class Context:
    """What a node needs: the run's files and this worker's model endpoint."""

    store: RunStore
    llm: HarnessSettings

    def tracer(self, node: str, **fields: object) -> Tracer:
        """A tracer for this run with the node (and ticket) on every line."""
        return self.store.tracer(node=node, **fields)

    def ticket_text(self, ticket_id: str) -> str:
        """The ticket's text as claimed into the run folder."""
        return self.store.ticket_path(ticket_id).read_text(encoding="utf-8")


def route(ctx: Context) -> dict[str, int]:
    """One model call classifies every claimed ticket; labels outside the list become other."""
    record = ctx.store.read()
    if record.done("route"):
        return {"tickets": len(record.tickets)}
    trace = ctx.tracer("route")
    _open(ctx, "route", trace)
    ids = list(record.tickets)
    system = prompts.ROUTER.format(categories=", ".join(record.config.categories))
    result = run_agent(
        system,
        prompts.router_input([(i, ctx.ticket_text(i)) for i in ids]),
        [],
        record.config,
        ctx.llm,
        trace,
        ctx.store.agent_path("_router", "route"),
    )
    if not result.ok:
        raise RouteFailed(f"the router did not answer: {result.error}")
    categories = _parse_routes(result.text or "", ids, record.config.categories, trace)
    with ctx.store.update() as rec:
        for ticket_id, category in categories.items():
            rec.tickets[ticket_id].category = category
            rec.tickets[ticket_id].status = TicketStatus.ROUTED
        node = rec.finish("route", result.usage.calls, result.usage.tokens)
    for ticket_id, category in categories.items():
        trace.emit("routed", ticket=ticket_id, category=category)
    trace.emit("node_end", ms=node.ms, calls=node.calls, tokens=node.tokens)
    return {"tickets": len(categories)}


def _parse_routes(text: str, ids: list[str], allowed: list[str], trace: Tracer) -> dict[str, str]:
    """Only `<claimed id>: <category>` lines count; unknown labels are clamped to other."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = ROUTE_LINE.match(line)
        if not match or match[1] not in ids:
            continue
        ticket_id, raw = match[1], match[2]
        category = raw if raw in allowed else OTHER
        if category != raw:
            trace.emit("clamped", ticket=ticket_id, raw=raw, category=category)
        found[ticket_id] = category
    return {ticket_id: found.get(ticket_id, OTHER) for ticket_id in ids}


def draft(ctx: Context, ticket_id: str) -> dict[str, str]:
    """Draft one ticket: its category's worker (a harness run) or the template."""
    record = ctx.store.read()
    ticket = record.tickets[ticket_id]
    if ticket.status is not TicketStatus.ROUTED:
        return {"ticket": ticket_id, "status": ticket.status.value}
    if "fanout" not in record.nodes:
        _open(ctx, "fanout", ctx.tracer("fanout"))
    trace = ctx.tracer("fanout", ticket=ticket_id)
    category = ticket.category or OTHER
    if category not in prompts.WORKERS:
        trace.emit("template_done")
        text = prompts.OTHER_TEMPLATE.format(ticket_id=ticket_id)
        return _drafted(ctx, ticket_id, text, "template", StepUsage())
    handler = f"worker:{category}"
    task = prompts.draft_input(ticket_id, ctx.ticket_text(ticket_id))
    result = _worker(ctx, record, ticket_id, category, "draft", task, trace)
    if not result.ok:
        error = result.error or "no draft"
        return fail_ticket(ctx, ticket_id, "fanout", error, handler, result.usage)
    trace.emit("worker_done", round=1, calls=result.usage.calls, tokens=result.usage.tokens)
    return _drafted(ctx, ticket_id, result.text or "", handler, result.usage)


def _drafted(
    ctx: Context, ticket_id: str, text: str, handler: str, usage: StepUsage
) -> dict[str, str]:
    """Leave the draft in the run folder for merge, and mark the ticket drafted."""
    atomic.write_text(ctx.store.draft_path(ticket_id), text.strip() + "\n")
    with ctx.store.update() as rec:
        t = rec.tickets[ticket_id]
        t.handler, t.draft, t.status = handler, usage, TicketStatus.DRAFTED
    return {"ticket": ticket_id, "status": TicketStatus.DRAFTED.value}


def _worker(
    ctx: Context,
    record: RunRecord,
    ticket_id: str,
    category: str,
    step: str,
    task: str,
    trace: Tracer,
) -> AgentResult:
    workspace = Path(record.workspace)
    return run_agent(
        prompts.WORKERS[category],
        task,
        tools_for(category, workspace),
        record.config,
        ctx.llm,
        trace,
        ctx.store.agent_path(ticket_id, step),
    )


def fail_ticket(
    ctx: Context,
    ticket_id: str,
    node: str,
    error: str,
    handler: str | None = None,
    usage: StepUsage | None = None,
) -> dict[str, str]:
    """Record a ticket's worker failure as its verdict; the rest of the batch goes on."""
    step = "draft" if node == "fanout" else "review"
    with ctx.store.update() as rec:
        t = rec.tickets[ticket_id]
        t.handler = handler or t.handler
        t.error, t.stop, t.status = error, "worker_failed", TicketStatus.NEEDS_HUMAN
        setattr(t, step, _add(getattr(t, step), usage or StepUsage()))
    ctx.tracer(node, ticket=ticket_id).emit("worker_failed", error=error)
    return {"ticket": ticket_id, "status": TicketStatus.NEEDS_HUMAN.value}


def merge(ctx: Context) -> dict[str, int]:
    """Publish every draft to out/<id>.txt and record only references and one-line summaries."""
    record = ctx.store.read()
    if record.done("merge"):
        return {"collected": sum(t.file is not None for t in record.tickets.values())}
    _close(ctx, "fanout", "draft")
    trace = ctx.tracer("merge")
    _open(ctx, "merge", trace)
    out = Path(record.workspace) / "out"
    published: dict[str, str] = {}
    for ticket_id, ticket in record.tickets.items():
        draft_file = ctx.store.draft_path(ticket_id)
        if ticket.status is not TicketStatus.DRAFTED or not draft_file.exists():
            continue
        text = draft_file.read_text(encoding="utf-8")
        atomic.write_text(out / f"{ticket_id}.txt", text)
        published[ticket_id] = text
        trace.emit(
            "collected", ticket=ticket_id, file=f"out/{ticket_id}.txt", chars=len(text.strip())
        )
    with ctx.store.update() as rec:
        for ticket_id, text in published.items():
            rec.tickets[ticket_id].file = f"out/{ticket_id}.txt"
            rec.tickets[ticket_id].one_line = report.one_line(text)
        node = rec.finish("merge")
        if rec.config.stop_after == "merge":
            rec.end(RunPhase.STOPPED, ExitCode.STOPPED)
    trace.emit("node_end", ms=node.ms, calls=0, tokens=0)
    return {"collected": sum(t.file is not None for t in ctx.store.read().tickets.values())}


def review(ctx: Context, ticket_id: str) -> dict[str, str]:
    """Gate one draft; while it fails, send it back to its worker; stop on the four reasons."""
    record = ctx.store.read()
    ticket = record.tickets[ticket_id]
    if ticket.status is not TicketStatus.DRAFTED:
        return {"ticket": ticket_id, "status": ticket.status.value}
    trace = ctx.tracer("review", ticket=ticket_id)
    if "review" not in record.nodes:
        _open(ctx, "review", ctx.tracer("review"))
    loop = ReviewLoop(ctx, record, ticket_id, trace)
    outcome = loop.run()
    with ctx.store.update() as rec:
        t = rec.tickets[ticket_id]
        t.gate_rounds, t.gate_reports, t.stop = loop.rounds, loop.reports, outcome.stop
        t.status = TicketStatus.PASS if outcome.stop == "gate_pass" else TicketStatus.NEEDS_HUMAN
        t.one_line, t.review, t.error = report.one_line(loop.text), loop.usage, outcome.error
        return {"ticket": ticket_id, "status": t.status.value}


@dataclass
class Outcome:
    """Why the review loop stopped."""

    stop: str
    error: str | None = None


class ReviewLoop:
    """Verify, fix, re-verify for one ticket, reading and writing its out/ file."""

    def __init__(self, ctx: Context, record: RunRecord, ticket_id: str, trace: Tracer) -> None:
        self.ctx, self.record, self.ticket_id, self.trace = ctx, record, ticket_id, trace
        self.ticket = record.tickets[ticket_id]
        self.path = Path(record.workspace) / (self.ticket.file or f"out/{ticket_id}.txt")
        self.text = self.path.read_text(encoding="utf-8").strip()
        self.rounds, self.usage = 0, StepUsage()
        self.reports: list[str] = []

    def check(self) -> gate.GateResult:
        """Gate the current text and trace the verdict of this round."""
        result = gate.check(self.ticket_id, self.text, self.record.config.filler_phrases)
        self.trace.emit("gate", round=self.rounds, **{"pass": result.passed}, report=result.report)
        return result

    def run(self) -> Outcome:
        """The loop; each `return` is one of the stop reasons."""
        verdict, last_report = self.check(), None
        while not verdict.passed:
            self.reports.append(verdict.report)
            if self.rounds >= self.record.config.max_rounds:
                return Outcome("max_rounds")
            if verdict.report == last_report:
                return Outcome("no_progress")
            if self.ticket.handler == "template" or self.ticket.category not in prompts.WORKERS:
                return Outcome("no_rewriter")
            last_report, self.rounds = verdict.report, self.rounds + 1
            if (error := self.rewrite(verdict.report)) is not None:
                return Outcome("worker_failed", error)
            verdict = self.check()
        return Outcome("gate_pass")

    def rewrite(self, gate_report: str) -> str | None:
        """Ask the same worker for a corrected draft; return an error text if it failed."""
        category = self.ticket.category or OTHER
        task = prompts.rewrite_input(self.ticket_id, self.text, gate_report)
        step = f"review-{self.rounds}"
        result = _worker(self.ctx, self.record, self.ticket_id, category, step, task, self.trace)
        self.usage = _add(self.usage, result.usage)
        if not result.ok:
            return result.error or "no rewrite"
        self.trace.emit(
            "worker_done",
            round=self.rounds + 1,
            calls=result.usage.calls,
            tokens=result.usage.tokens,
        )
        self.text = (result.text or "").strip()
        atomic.write_text(self.path, self.text + "\n")
        return None


def finish_report(ctx: Context) -> dict[str, int]:
    """Close review, render the report, and record the exit code."""
    record = ctx.store.read()
    if record.status is RunPhase.DONE and record.exit_code is not None:
        return {"exit_code": record.exit_code}
    _close(ctx, "review", "review", rounds=True)
    trace = ctx.tracer("report")
    _open(ctx, "report", trace)
    record = ctx.store.read()
    needs_human = [t for t in record.tickets.values() if t.status is not TicketStatus.PASS]
    code = ExitCode.NEEDS_HUMAN if needs_human else ExitCode.ALL_PASS
    atomic.write_text(ctx.store.report_path, report.render(record))
    with ctx.store.update() as rec:
        node = rec.finish("report")
        rec.end(RunPhase.DONE, code)
    trace.emit("node_end", ms=node.ms, calls=0, tokens=0)
    return {"exit_code": code}


def _open(ctx: Context, node: str, trace: Tracer) -> None:
    """Open a node once per run (the first task to get here does), tracing node_start."""
    with ctx.store.update() as rec:
        opened = rec.begin(node)
    if opened:
        trace.emit("node_start")


def _close(ctx: Context, node: str, step: str, rounds: bool = False) -> None:
    """Close a fan-out node with the sum of its tickets' calls and tokens."""
    with ctx.store.update() as rec:
        if rec.done(node):
            return
        usages = [getattr(t, step) for t in rec.tickets.values()]
        total_rounds = sum(t.gate_rounds for t in rec.tickets.values()) if rounds else None
        node_rec = rec.finish(
            node, sum(u.calls for u in usages), sum(u.tokens for u in usages), total_rounds
        )
    ctx.tracer(node).emit("node_end", ms=node_rec.ms, calls=node_rec.calls, tokens=node_rec.tokens)


def _add(a: StepUsage, b: StepUsage) -> StepUsage:
    return StepUsage(
        calls=a.calls + b.calls, tokens=a.tokens + b.tokens, cost_usd=a.cost_usd + b.cost_usd
    )
