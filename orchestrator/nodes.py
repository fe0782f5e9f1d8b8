"""The five nodes as plain functions over a run folder. Celery tasks only call these.

Every node is idempotent per run and ticket: it reads the records, skips work already done,
and persists after each small step, so a resumed run never pays for a finished step again.
A per-ticket step reads and writes only run.json and its own ticket's record; the
single-writer steps (route, merge, report) read every record and materialise run-state.json.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import gate, ids, inbox, prompts, report, routing
from orchestrator.agents import AgentResult, run_agent
from orchestrator.errors import RouteFailed, RunStorageError
from orchestrator.exit_codes import ExitCode
from orchestrator.records import (
    NodeRecord,
    RunMeta,
    RunPhase,
    StepUsage,
    TicketRecord,
    TicketStatus,
)
from orchestrator.runstate import ROUTER, RunStore
from orchestrator.toolbox import tools_for
from workers.cancel import CancelToken
from workers.settings import HarnessSettings
from workers.trace import Tracer

OTHER = routing.OTHER


@dataclass
class Context:
    """What a node needs: the run's files, this worker's model endpoint, and the token that
    stops its agents (the task's soft time limit sets it)."""

    store: RunStore
    llm: HarnessSettings
    cancel: CancelToken = field(default_factory=CancelToken)

    @functools.cached_property
    def meta(self) -> RunMeta:
        """run.json as this step found it (config, workspace)."""
        return self.store.meta()

    def tracer(self, node: str, **fields: object) -> Tracer:
        """A tracer for this run with the node (and ticket) on every line."""
        return self.store.tracer(node=node, **fields)

    def ticket_text(self, ticket_id: str) -> str:
        """The ticket's text as claimed into the run folder."""
        return self.store.ticket_path(ticket_id).read_text(encoding="utf-8")


UNROUTED = "unrouted"  # the stop of a ticket the router named no category for, twice


def route(ctx: Context) -> list[str]:
    """One model call classifies every claimed ticket; labels outside the list become other.
    Tickets the reply did not name are asked about once more; those still not named need a
    human (stop `unrouted`). Returns the tickets drafting should take."""
    if _done(ctx, "route"):
        return [i for i, t in ctx.store.tickets().items() if t.status is TicketStatus.ROUTED]
    ids = ctx.store.ticket_ids()
    trace = ctx.tracer("route")
    _open(ctx, "route", trace)
    config = ctx.meta.config
    result = _ask_router(ctx, ids, "route", trace)
    if not result.ok:
        again = (
            "resume retries it"
            if result.retryable
            else "fix it, then resume with --retry-failed all"
        )
        raise RouteFailed(f"the router did not answer: {result.error} ({again})")
    decisions = _decide_routes(result.text or "", ids, ids, config.categories, trace)
    usage = result.usage
    if missing := [i for i, d in decisions.items() if d.how == "missing"]:
        second = _ask_router(ctx, missing, "route-again", trace)
        usage = usage + second.usage
        if not second.ok and second.retryable:  # resume asks again (the first is paid)
            raise RouteFailed(
                f"the router did not answer again: {second.error} (resume retries it)"
            )
        if second.ok:
            found = _decide_routes(second.text or "", ids, missing, config.categories, trace)
            decisions |= {i: d for i, d in found.items() if d.how != "missing"}
    tickets = ctx.store.tickets()
    for ticket_id, decision in decisions.items():
        _routed(tickets[ticket_id], decision)
    ctx.store.save_tickets(tickets)
    for ticket_id, ticket in tickets.items():
        if ticket.stop == UNROUTED:
            trace.emit(UNROUTED, ticket=ticket_id, error=ticket.error)
            trace.emit("verdict", ticket=ticket_id, stop=UNROUTED, status=ticket.status.value)
        else:
            trace.emit("routed", ticket=ticket_id, category=ticket.category)
    _close(ctx, "route", trace, usage)
    if config.stop_after == "route":
        stop_early(ctx.store, tickets)
        return []
    ctx.store.materialise(tickets)
    return [i for i, t in tickets.items() if t.status is TicketStatus.ROUTED]


def _routed(ticket: TicketRecord, decision: routing.Decision) -> None:
    """Record how the ticket was routed: its category, or, if it has none, a person."""
    ticket.routing, ticket.routed_as = decision.how, decision.raw
    if decision.category is None:
        ticket.status, ticket.stop = TicketStatus.NEEDS_HUMAN, UNROUTED
        ticket.error = "the router named no category for it, asked twice"
    else:
        ticket.category, ticket.status = decision.category, TicketStatus.ROUTED


def _ask_router(ctx: Context, ids: list[str], step: str, trace: Tracer) -> AgentResult:
    """One routing call about `ids` (its agent state: `_router.<step>`)."""
    config = ctx.meta.config
    return run_agent(
        prompts.ROUTER.format(categories=", ".join(config.categories)),
        prompts.router_input(
            [(i, inbox.route_text(ctx.ticket_text(i), config.route_chars)) for i in ids]
        ),
        [],
        config,
        ctx.llm,
        trace,
        ctx.store.agent_path(ROUTER, step),
        ctx.cancel,
        role="router",
        fence=ctx.store.fence,
    )


def _parse_routes(text: str, ids: list[str], allowed: list[str], trace: Tracer) -> dict[str, str]:
    """Claimed id -> category from the router's reply; how each was decided is traced."""
    decisions = _decide_routes(text, ids, ids, allowed, trace)
    return {i: d.category or "" for i, d in decisions.items()}


def _decide_routes(
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


def draft(ctx: Context, ticket_id: str) -> str:
    """Draft one ticket: its category's worker (a harness run) or the template."""
    ticket = ctx.store.ticket(ticket_id)
    if ticket.status is not TicketStatus.ROUTED:
        return ticket.status.value
    if ctx.store.node("fanout") is None:
        _open(ctx, "fanout", ctx.tracer("fanout"))
    trace = ctx.tracer("fanout", ticket=ticket_id)
    category = ticket.category or OTHER
    if category not in prompts.WORKERS:
        trace.emit("template_done")
        text = prompts.OTHER_TEMPLATE.format(ticket_id=ticket_id)
        return _drafted(ctx, ticket_id, text, "template", StepUsage())
    handler = f"worker:{category}"
    task = prompts.draft_input(ticket_id, ctx.ticket_text(ticket_id))
    result = _worker(ctx, ticket_id, category, "draft", task, trace)
    if not result.ok:
        error = result.error or "no draft"
        return fail_ticket(
            ctx, ticket_id, "fanout", error, handler, result.usage, result.retryable, result.stop
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


def _worker(
    ctx: Context, ticket_id: str, category: str, step: str, task: str, trace: Tracer
) -> AgentResult:
    return run_agent(
        prompts.WORKERS[category],
        task,
        tools_for(
            category,
            Path(ctx.meta.workspace),
            ctx.meta.config.reads,
            (ctx.store.actions_path, ticket_id),
        ),
        ctx.meta.config,
        ctx.llm,
        trace,
        ctx.store.agent_path(ticket_id, step),
        ctx.cancel,
        role=category,
        fence=ctx.store.fence,
    )


def fail_ticket(
    ctx: Context,
    ticket_id: str,
    node: str,
    error: str,
    handler: str | None = None,
    usage: StepUsage | None = None,
    retryable: bool = True,
    stop: str = "worker_failed",
) -> str:
    """Record a ticket's worker failure as its verdict; the rest of the batch goes on.
    `retryable`: `resume` tries it again (a provider outage, a crash of ours, a time limit);
    `stop`: worker_failed, or time_limit when the task ran out of time."""
    step = "draft" if node == "fanout" else "review"
    ticket = ctx.store.ticket(ticket_id)
    ticket.handler = handler or ticket.handler
    ticket.error, ticket.stop, ticket.status = error, stop, TicketStatus.NEEDS_HUMAN
    ticket.retryable = retryable
    setattr(ticket, step, getattr(ticket, step) + (usage or StepUsage()))
    ctx.store.save_ticket(ticket_id, ticket)
    ctx.tracer(node, ticket=ticket_id).emit(stop, error=error)
    return ticket.status.value


def merge(ctx: Context) -> list[str]:
    """Publish every draft to out/<id>.txt, record references and one-line summaries; return
    the tickets review should take (none when the run stops after merge)."""
    tickets = ctx.store.tickets()
    if not _done(ctx, "merge"):
        _publish(ctx, tickets)
    if ctx.meta.config.stop_after == "merge":
        stop_early(ctx.store, tickets)
        return []
    return [i for i, t in tickets.items() if t.status is TicketStatus.DRAFTED]


def _publish(ctx: Context, tickets: dict[str, TicketRecord]) -> None:
    """Close the fan-out, copy drafts to out/ in one flush, and list what was published.

    Ticket records are not rewritten here (that would be N more writes in the one step no
    other can overlap): published.json says which tickets have an out/ file and their
    summaries, and review writes both into each ticket's record when it takes it.
    """
    _close_fanout(ctx, "fanout", [t.draft for t in tickets.values()])
    trace = ctx.tracer("merge")
    _open(ctx, "merge", trace)
    workspace = Path(ctx.meta.workspace)
    writes: list[tuple[Path, str]] = []
    summaries: dict[str, str] = {}
    for ticket_id, ticket in tickets.items():
        draft_file = ctx.store.draft_path(ticket_id)
        if ticket.status is not TicketStatus.DRAFTED or not draft_file.exists():
            continue
        text = draft_file.read_text(encoding="utf-8")
        summaries[ticket_id] = report.one_line(text)
        writes.append((ids.out_file(workspace, ticket_id), text))
        trace.emit(
            "collected", ticket=ticket_id, file=f"out/{ticket_id}.txt", chars=len(text.strip())
        )
    ctx.store.write_many(writes)
    ctx.store.save_published(summaries)
    _close(ctx, "merge", trace)
    ctx.store.materialise(tickets)


def review(ctx: Context, ticket_id: str) -> str:
    """Gate one draft; while it fails, send it back to its worker; stop on the four reasons."""
    ticket = ctx.store.ticket(ticket_id)
    if ticket.status is not TicketStatus.DRAFTED:
        return ticket.status.value
    trace = ctx.tracer("review", ticket=ticket_id)
    if ctx.store.node("review") is None:
        _open(ctx, "review", ctx.tracer("review"))
    loop = ReviewLoop(ctx, ticket_id, ticket, trace)
    outcome = loop.run()
    ticket = loop.ticket
    ticket.file = f"out/{ticket_id}.txt"
    ticket.gate_rounds, ticket.gate_reports, ticket.stop = loop.rounds, loop.reports, outcome.stop
    if outcome.stop == "gate_pass" and ticket.unsure_writes:
        # The reply may say a refund was filed that a crash cut off: a person checks.
        calls = ", ".join(ticket.unsure_writes)
        outcome = Outcome(
            "write_unsure", f"a write tool call was cut off by a crash ({calls}): check it"
        )
        ticket.stop = outcome.stop
    passed = outcome.stop == "gate_pass"
    ticket.status = TicketStatus.PASS if passed else TicketStatus.NEEDS_HUMAN
    ticket.summary = report.summary(loop.text)
    ticket.one_line, ticket.review, ticket.error = (
        report.one_line(loop.text),
        loop.usage,
        outcome.error,
    )
    ticket.retryable = outcome.retryable
    ctx.store.save_ticket(ticket_id, ticket)
    trace.emit("verdict", stop=ticket.stop, status=ticket.status.value)
    return ticket.status.value


@dataclass
class Outcome:
    """Why the review loop stopped."""

    stop: str
    error: str | None = None
    retryable: bool = False


class _Stopped(Exception):
    """The evaluator ended the loop (no verdict, or a failed agent run)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.stop)
        self.outcome = outcome


VERDICT = re.compile(r"(PASS|FAIL:\s*\S[^\n]{0,300})")


def evaluator_verdict(text: str) -> str | None:
    """`PASS` or `FAIL: <why>` when the evaluator's whole answer is exactly one of those
    (one line; `FAIL:` needs a reason); None for anything else."""
    answer = text.strip()
    return answer if VERDICT.fullmatch(answer) else None


class ReviewLoop:
    """Verify, fix, re-verify for one ticket, reading and writing its out/ file."""

    def __init__(self, ctx: Context, ticket_id: str, ticket: TicketRecord, trace: Tracer) -> None:
        self.ctx, self.ticket_id, self.ticket, self.trace = ctx, ticket_id, ticket, trace
        self.config = ctx.meta.config
        self.path = ids.out_file(Path(ctx.meta.workspace), ticket_id)
        self.text = self.path.read_text(encoding="utf-8").strip()
        self.rounds, self.usage = 0, StepUsage()
        self.reports: list[str] = []

    @functools.cached_property
    def sources(self) -> gate.Sources:
        """What the draft may draw on: its task, the ticket, and every tool result the
        ticket's agent runs got."""
        ticket_text = self.ctx.ticket_text(self.ticket_id)
        facts = [ticket_text]
        for path in sorted((self.ctx.store.dir / "agents").glob(f"{self.ticket_id}.*.json")):
            try:
                messages = json.loads(path.read_text(encoding="utf-8")).get("messages", [])
            except (OSError, ValueError):
                continue
            facts += [m.get("content") or "" for m in messages if m.get("role") == "tool"]
        return gate.Sources(task=prompts.draft_input(self.ticket_id, ticket_text), facts=facts)

    def check(self) -> gate.GateResult:
        """Gate the current text and trace the verdict of this round."""
        rules = gate.Rules(
            filler_phrases=self.config.filler_phrases,
            off=frozenset(self.config.gate_off),
            min_chars=self.config.min_chars,
            max_chars=self.config.max_chars,
        )
        result = gate.check(
            self.ticket_id, self.text, self.config.filler_phrases, self.sources, rules
        )
        self.trace.emit("gate", round=self.rounds, **{"pass": result.passed}, report=result.report)
        if result.passed and self.config.evaluator:
            return self.evaluate()
        return result

    def evaluate(self) -> gate.GateResult:
        """The model-based check, on a draft the deterministic gate passed: PASS, or a FAIL
        whose reason goes to the rewriter like a gate report. Anything else stops the loop."""
        task = prompts.evaluator_input(
            self.ticket_id, self.ctx.ticket_text(self.ticket_id), self.text
        )
        result = run_agent(
            prompts.EVALUATOR,
            task,
            [],
            self.config,
            self.ctx.llm,
            self.trace,
            self.ctx.store.agent_path(self.ticket_id, f"evaluate-{self.rounds}"),
            self.ctx.cancel,
            role="evaluator",
            fence=self.ctx.store.fence,
        )
        self.usage = self.usage + result.usage  # the evaluator's cost is review's
        if not result.ok:
            raise _Stopped(Outcome(result.stop, result.error or "no verdict", result.retryable))
        verdict = evaluator_verdict(result.text or "")
        self.trace.emit("evaluated", round=self.rounds, verdict=verdict or "unclear")
        if verdict is None:
            shown = (result.text or "").strip()[:120]
            raise _Stopped(Outcome("evaluator_unclear", f"the evaluator said {shown!r}"))
        if verdict == "PASS":
            return gate.GateResult(True, "")
        return gate.GateResult(False, f"evaluator:{verdict.removeprefix('FAIL:').strip()}")

    def run(self) -> Outcome:
        """The loop; each `return` is one of the stop reasons."""
        try:
            return self._run()
        except _Stopped as stopped:
            return stopped.outcome

    def _run(self) -> Outcome:
        verdict, last_report = self.check(), None
        while not verdict.passed:
            self.reports.append(verdict.report)
            if self.rounds >= self.config.max_rounds:
                return Outcome("max_rounds")
            if verdict.report == last_report:
                return Outcome("no_progress")
            if self.ticket.handler == "template" or self.ticket.category not in prompts.WORKERS:
                return Outcome("no_rewriter")
            last_report, self.rounds = verdict.report, self.rounds + 1
            if (failed := self.rewrite(verdict.report)) is not None:
                return Outcome(failed.stop, failed.error or "no rewrite", failed.retryable)
            verdict = self.check()
        return Outcome("gate_pass")

    def rewrite(self, gate_report: str) -> AgentResult | None:
        """Ask the same worker for a corrected draft; return the failed result if it failed."""
        category = self.ticket.category or OTHER
        task = prompts.rewrite_input(self.ticket_id, self.text, gate_report)
        step = f"review-{self.rounds}"
        result = _worker(self.ctx, self.ticket_id, category, step, task, self.trace)
        self.usage = self.usage + result.usage
        self.ticket.unsure_writes += [
            c for c in result.unsure_writes if c not in self.ticket.unsure_writes
        ]
        if not result.ok:
            return result
        self.trace.emit(
            "worker_done",
            round=self.rounds + 1,
            calls=result.usage.calls,
            tokens=result.usage.tokens,
        )
        self.text = (result.text or "").strip()
        self.ctx.store.write(self.path, self.text + "\n")
        return None


def finish_report(ctx: Context) -> int:
    """Close review, render the report, and record the exit code."""
    meta = ctx.store.meta()
    if meta.status is RunPhase.DONE and meta.exit_code is not None:
        return meta.exit_code
    tickets = ctx.store.tickets()
    _close_fanout(ctx, "review", [t.review for t in tickets.values()], tickets)
    trace = ctx.tracer("report")
    _open(ctx, "report", trace)
    needs_human = [t for t in tickets.values() if t.status is not TicketStatus.PASS]
    looked_at = needs_human or ctx.meta.rejected
    code = ExitCode.NEEDS_HUMAN if looked_at else ExitCode.ALL_PASS
    ctx.store.write(ctx.store.report_path, report.render(ctx.store.read(tickets)))
    _close(ctx, "report", trace)
    with ctx.store.update_meta() as run:
        run.end(RunPhase.DONE, code)
    ctx.store.materialise(tickets)
    return code


def stop_early(store: RunStore, tickets: dict[str, TicketRecord] | None = None) -> None:
    """End the run at the stop point it was asked to stop at (exit 2, resumable)."""
    with store.update_meta() as run:
        run.end(RunPhase.STOPPED, ExitCode.STOPPED)
    store.materialise(tickets)


def record_crash(store: RunStore, exc: BaseException) -> int:
    """Mark the run crashed, with the error, in its state and its trace; return exit code 3.

    If the run folder itself cannot be written (the usual cause of such a crash), raise
    `RunStorageError` with both errors: the caller reports it, and `resume` works once fixed.
    """
    error = crash_text(exc)
    try:
        with store.update_meta() as run:
            run.end(RunPhase.CRASHED, ExitCode.CRASHED, error)
        store.tracer(node="run").emit("run_crashed", error=error)
        store.materialise()
    except OSError as unwritable:
        if isinstance(exc, RunStorageError):  # already the story of a crash left unrecorded
            raise exc from unwritable
        raise RunStorageError(
            f"{error} (and the crash could not be recorded: {crash_text(unwritable)})"
        ) from exc
    return ExitCode.CRASHED


def crash_text(exc: BaseException) -> str:
    """An error as one line; an OSError names its path."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{type(exc).__name__}: {exc.strerror or exc}: {exc.filename}"
    return f"{type(exc).__name__}: {exc}"


def _done(ctx: Context, node: str) -> bool:
    record = ctx.store.node(node)
    return record is not None and record.done


def _open(ctx: Context, node: str, trace: Tracer) -> None:
    """Open a node once per run (the first task to get here does), tracing node_start."""
    if ctx.store.open_node(node, NodeRecord(started=time.time())):
        trace.emit("node_start")


def _close(ctx: Context, node: str, trace: Tracer, usage: StepUsage | None = None) -> None:
    """Close a node with its totals and trace node_end."""
    record = ctx.store.node(node) or NodeRecord(started=time.time())
    usage = usage or StepUsage()
    record.close(usage.calls, usage.tokens, usage=usage)
    ctx.store.save_node(node, record)
    trace.emit("node_end", ms=record.ms, calls=record.calls, tokens=record.tokens)


def _close_fanout(
    ctx: Context,
    node: str,
    usages: list[StepUsage],
    tickets: dict[str, TicketRecord] | None = None,
) -> None:
    """Close a fan-out node with the sum of its tickets' calls and tokens (and rounds)."""
    record = ctx.store.node(node) or NodeRecord(started=time.time())
    if record.done:
        return
    total = sum(usages, StepUsage())
    rounds = sum(t.gate_rounds for t in tickets.values()) if tickets is not None else None
    record.close(total.calls, total.tokens, rounds, usage=total)
    ctx.store.save_node(node, record)
    ctx.tracer(node).emit("node_end", ms=record.ms, calls=record.calls, tokens=record.tokens)
