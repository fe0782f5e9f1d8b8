"""review: the deterministic gate, and the verify-fix-reverify loop that sends a failing draft
back to its worker, until it stops on `gate_pass`, `no_progress` (the same report twice),
`max_rounds` or `no_rewriter` (template drafts); an optional evaluator after the gate."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.run import ids
from orchestrator.run.records import StepUsage, TicketRecord, TicketStatus
from orchestrator.steps import agent, gate, prompts, report, routing, voting
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.context import Context
from orchestrator.steps.draft import DRAFT, worker
from workers.trace import Tracer


def rewrite_step(k: int) -> str:
    """The agent-state name of rewrite `k` (agents/<ticket>.review-<k>.json)."""
    return f"review-{k}"


def review(ctx: Context, ticket_id: str, ticket: TicketRecord) -> TicketRecord:
    """Gate one draft; while it fails, send it back to its worker; stop on the four reasons.
    Return the ticket's record with its verdict."""
    trace = ctx.tracer(ticket=ticket_id)
    loop = ReviewLoop(ctx, ticket_id, ticket, trace)
    try:
        outcome = loop.run()
    except _Waiting as waiting:  # a rewrite's call needs a person: resume takes it up here
        call = waiting.result.waiting
        return ctx.wait_for_person(ticket_id, loop.ticket, call, None, loop.usage)  # type: ignore[arg-type]
    ticket = loop.ticket
    ticket.file = ids.out_name(ticket_id)
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
    ctx.tell(ticket_id, "verdict", stop=ticket.stop, status=ticket.status.value)
    return ticket


@dataclass
class Outcome:
    """Why the review loop stopped."""

    stop: str
    error: str | None = None
    retryable: bool = False


class _Waiting(Exception):
    """A rewrite stopped for a call a person must decide."""

    def __init__(self, result: AgentResult) -> None:
        super().__init__("awaiting approval")
        self.result = result


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
        self.path = ids.out_file(Workspace(Path(ctx.meta.workspace)), ticket_id)
        self.text = self.path.read_text(encoding="utf-8").strip()
        self.rounds, self.usage = 0, StepUsage()
        self.reports: list[str] = []

    @functools.cached_property
    def ticket_text(self) -> str:
        """The ticket's text (read once a review)."""
        return self.ctx.ticket_text(self.ticket_id)

    @functools.cached_property
    def task(self) -> str:
        """The task the ticket's worker was given."""
        return prompts.draft_input(self.ticket_id, self.ticket_text)

    @property
    def sources(self) -> gate.Sources:
        """What the draft may draw on now: its task, the ticket, and every tool result the
        ticket's agent runs got so far (read only if a check needs them: most drafts name
        no order id and no amount)."""
        return gate.Sources(task=self.task, load=self.facts)

    def facts(self) -> list[str]:
        """The ticket's text and every tool result its worker runs got so far."""
        return gate.seen_by(self.ticket_text, self.worker_states())

    def worker_states(self) -> list[Path]:
        """Where the ticket's worker runs keep their states, whether they ran or not: the
        draft's and each rewrite's (the only agents with tools; the evaluator has none).
        Named, not listed: a glob of agents/ reads every ticket's files, 16 ms a review at
        15,000 of them, so a run's review cost grew with its size."""
        rewrites = (rewrite_step(k) for k in range(1, self.config.max_rounds + 1))
        draft = DRAFT if self.angle is None else voting.step(self.angle)
        return [self.ctx.store.agent_path(self.ticket_id, s) for s in (draft, *rewrites)]

    @property
    def angle(self) -> str | None:
        """The angle whose draft won the ticket's vote (its rewrites use its prompt)."""
        return self.ticket.vote.angle if self.ticket.vote is not None else None

    @functools.cached_property
    def rules(self) -> gate.Rules:
        """The gate's settings for this ticket (with the workspace's own checks)."""
        view = gate.TicketView(self.ticket_id, self.ticket_text, self.ticket.category)
        return gate.rules_for(self.config, Workspace(Path(self.ctx.meta.workspace)), view)

    def check(self) -> gate.GateResult:
        """Gate the current text and trace the verdict of this round."""
        rules = self.rules
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
        task = prompts.evaluator_input(self.ticket_id, self.ticket_text, self.text)
        path = self.ctx.store.agent_path(self.ticket_id, f"evaluate-{self.rounds}")
        result = agent.run_agent(self.ctx, "evaluator", prompts.EVALUATOR, task, path, self.trace)
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
            workers = self.config.workers
            if self.ticket.handler == "template" or self.ticket.category not in workers:
                return Outcome("no_rewriter")
            last_report, self.rounds = verdict.report, self.rounds + 1
            if (failed := self.rewrite(verdict.report)) is not None:
                return Outcome(failed.stop, failed.error or "no rewrite", failed.retryable)
            verdict = self.check()
        return Outcome("gate_pass")

    def rewrite(self, gate_report: str) -> AgentResult | None:
        """Ask the same worker for a corrected draft; return the failed result if it failed."""
        category = self.ticket.category or routing.OTHER
        task = prompts.rewrite_input(self.ticket_id, self.text, gate_report)
        step = rewrite_step(self.rounds)
        result = worker(self.ctx, self.ticket_id, category, step, task, self.trace, self.angle)
        self.usage = self.usage + result.usage
        self.ticket.unsure_writes += [
            c for c in result.unsure_writes if c not in self.ticket.unsure_writes
        ]
        if result.waiting is not None:
            raise _Waiting(result)
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
