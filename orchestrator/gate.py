"""The deterministic gate: plain string checks, the same answer every time, no model call."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GateResult:
    """Whether a draft passed, and the report that goes back to the rewriter."""

    passed: bool
    report: str


def check(ticket_id: str, draft: str, filler_phrases: list[str]) -> GateResult:
    """Fail a draft that lacks the ticket id or contains a filler phrase (case-insensitive)."""
    problems = []
    if ticket_id not in draft:
        problems.append("missing_ticket_id")
    lowered = draft.lower()
    problems += [f"filler_word:{p}" for p in filler_phrases if p.lower() in lowered]
    return GateResult(passed=not problems, report=" | ".join(problems))
