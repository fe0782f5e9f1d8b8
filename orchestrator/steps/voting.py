"""voting: a ticket drafted once from each of its worker's angles (seed 003, Level 2), and the
draft it goes on with chosen by code, never by a model.

Each angle's draft is a whole agent run of its own (its turns, budget, approvals, trace; its
state in agents/<ticket>.draft-<angle>.json), run one after the other in the draft step. Then
two rules, in order: the deterministic gate eliminates every draft that fails any check (the
same rules review applies, on the tool results that angle saw); among the survivors the
shortest wins (customer replies should not run long; a tie goes to the angle declared
first). If none survives, the shortest draft goes to review as any failing draft does. The
choice is traced (`voted`: every candidate's gate report, and why the winner won) and kept in
the ticket's record (`vote`); every angle's cost is the draft's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.run.records import Candidate, StepUsage, Vote
from orchestrator.steps import gate
from orchestrator.steps.agent import AgentResult
from orchestrator.steps.context import Context
from workers.trace import Tracer

DraftFrom = Callable[[str], AgentResult]  # one angle's draft, through the whole agent loop


def step(angle: str) -> str:
    """The agent-state name of an angle's draft (agents/<ticket>.draft-<angle>.json)."""
    return f"draft-{angle}"


def vote(
    ctx: Context, ticket_id: str, category: str, task: str, trace: Tracer, draft_from: DraftFrom
) -> tuple[AgentResult, Vote | None]:
    """Draft from every angle of `category`'s worker and choose one: the winner's result
    (its text, every angle's cost) and the vote; or, with no vote, the result that ends the
    step as a single draft's would (a call waits for a person, a retryable stop, no angle
    gave a draft), with every angle's cost so far."""
    angles = list(ctx.meta.config.workers[category].angles)
    results: dict[str, AgentResult] = {}
    for angle in angles:
        results[angle] = result = draft_from(angle)
        if result.waiting is not None or (not result.ok and result.retryable):
            return _with_all(result, results.values()), None  # resume takes the vote up
    ticket = gate.TicketView(ticket_id, ctx.ticket_text(ticket_id), category)
    rules = gate.rules_for(ctx.meta.config, Workspace(Path(ctx.meta.workspace)), ticket)
    candidates = [
        _candidate(angle, results[angle], task, rules, ctx.store.agent_path(ticket_id, step(angle)))
        for angle in angles
    ]
    if all(c.chars is None for c in candidates):
        return _with_all(results[angles[0]], results.values()), None
    winner, why = choose(candidates)
    trace.emit(
        "voted", angle=winner.angle, why=why, candidates=[c.model_dump() for c in candidates]
    )
    chosen = dataclasses.replace(results[winner.angle], error=None)
    return _with_all(chosen, results.values()), Vote(
        angle=winner.angle, why=why, candidates=candidates
    )


def choose(candidates: list[Candidate]) -> tuple[Candidate, str]:
    """The winner among the drafts (`chars` set) and why: the gate eliminates, the shortest
    survivor wins; with no survivor, the shortest draft. `min` keeps the first on a tie."""
    drafted = [c for c in candidates if c.chars is not None]
    passed = [c for c in drafted if c.passed]
    winner = min(passed or drafted, key=lambda c: c.chars or 0)
    return winner, _why(winner, candidates, passed)


def _why(winner: Candidate, candidates: list[Candidate], passed: list[Candidate]) -> str:
    """One sentence a person reads in the report and on the ticket's page."""
    out = "; ".join(f"{c.angle}: {c.report}" for c in candidates if not c.passed)
    if not passed:
        return (
            f"no draft passed the gate, so the shortest ({winner.chars} characters) goes to "
            f"review ({out})"
        )
    if len(passed) == 1:
        why = f"the only draft the gate passed ({winner.chars} characters)"
    else:
        sizes = ", ".join(f"{c.angle} {c.chars}" for c in passed)
        why = f"the shortest draft the gate passed ({sizes} characters)"
        if sum(c.chars == winner.chars for c in passed) > 1:
            why += "; a tie goes to the angle declared first"
    return f"{why}; the gate eliminated {out}" if out else why


def _candidate(
    angle: str, result: AgentResult, task: str, rules: gate.Rules, state: Path
) -> Candidate:
    """One angle's draft as the vote sees it: gated on the tool results its own run got."""
    if not result.ok:
        why = result.error or result.stop
        return Candidate(angle=angle, report=f"no draft ({why})", usage=result.usage)
    text = (result.text or "").strip()
    ticket = rules.ticket or gate.TicketView("", "")
    sources = gate.Sources(task=task, load=lambda: gate.seen_by(ticket.text, [state]))
    verdict = gate.check(ticket.id, text, rules.filler_phrases, sources, rules)
    return Candidate(
        angle=angle,
        chars=len(text),
        passed=verdict.passed,
        report=verdict.report,
        usage=result.usage,
    )


def _with_all(result: AgentResult, every: Iterable[AgentResult]) -> AgentResult:
    """`result` with the cost of every angle's run and each one's interrupted writes."""
    usage, unsure = StepUsage(), []
    for one in every:
        usage = usage + one.usage
        unsure += [c for c in one.unsure_writes if c not in unsure]
    return dataclasses.replace(result, usage=usage, unsure_writes=unsure)
