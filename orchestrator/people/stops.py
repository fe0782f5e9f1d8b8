"""Why a ticket waits for a person, in words: each stop code a run records, explained, with
the detail that goes with it (the gate's first report line, or the error's first line)."""

from __future__ import annotations

from orchestrator.run import waitlist
from orchestrator.run.records import TicketRecord

STOPS = {
    "no_progress": "the rewrite did not fix what the gate found (the same report twice)",
    "max_rounds": "the reply still failed the gate after the last rewrite ([gate] max_rounds)",
    "no_rewriter": "a template reply failed the gate, and a template is not rewritten",
    "write_unsure": "a crash cut off a write tool call: check whether it was made",
    "evaluator_unclear": "the evaluator answered neither PASS nor FAIL",
    "worker_failed": "the worker failed before it replied",
    "time_limit": "the step ran out of time before a reply",
    "max_turns": "the worker used all its turns without a reply",
    "budget": "the budget ran out before a reply",
    "declarations_differ": "a worker's tools or checks differ from those the run started with",
    "cancelled": "the ticket was cancelled",
    "approval_expired": "a tool call waited longer than [approvals] expire_h undecided",
    "unrouted": "the router named no category for it",
}


def explained(stop: str | None) -> str:
    """A stop code in words (an unknown one as it is)."""
    if stop is None:
        return "it needs a person"
    base = stop.split(" ", 1)[0].split(":", 1)[0]
    return STOPS.get(base, stop.replace("_", " "))


def reason(record: TicketRecord) -> str:
    """Why the ticket needs a person, in one line."""
    return worded(record.stop, waitlist.detail(record))


def worded(stop: str | None, more: str | None) -> str:
    """A stop code in words, with its detail (`waitlist.detail`'s) if there is one."""
    said = explained(stop)
    return f"{said}: {more}" if more else said
