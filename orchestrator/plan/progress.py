"""The progress line each step's row prints once its node is done (`run` and `resume` in
line mode: `[route] T-1001=billing …`), as in the seed. A step without a line of its own
prints what its node spent (`spent`); the report prints none."""

from __future__ import annotations

from collections import Counter

from orchestrator.run.records import FAILED_STOPS, RunRecord, TicketStatus
from orchestrator.steps.report import counted, usd

# Past this many tickets a progress line gives counts, not every id (the full list is in
# run-state.json and the report): a 10,000-ticket run's route line was 200 KB.
LIST_AT_MOST = 20


def spent(record: RunRecord, node: str) -> str:
    """What a node spent: `3 model calls, 1200 tokens, $0.0012`."""
    done = record.nodes[node]
    calls = counted(done.calls, "model call")
    return f"{calls}, {done.tokens} tokens, {usd(done.cost_usd, done.estimated)}"


def routed(record: RunRecord, node: str) -> str:
    """Each ticket's category, or, for many tickets, how many went to each category."""
    if len(record.tickets) <= LIST_AT_MOST:
        return "  ".join(f"{i}={t.category or t.stop}" for i, t in record.tickets.items())
    counts = Counter(t.category or t.stop for t in record.tickets.values())
    each = "  ".join(f"{c}={n}" for c, n in counts.items())
    return f"{counted(len(record.tickets), 'ticket')}: {each}"


def drafted(record: RunRecord, node: str) -> str:
    """The pool size, how many drafts the draft step made, and of the tickets it took, how many
    failed or wait for a person; tickets the router named nothing for were never drafted."""
    made = failed = waiting = 0
    for t in record.tickets.values():
        # A draft that failed leaves no file; a review that failed later still has one.
        if t.stop in FAILED_STOPS and t.file is None:
            failed += 1
        elif t.status is TicketStatus.AWAITING_APPROVAL:
            waiting += 1
        elif t.handler is not None:
            made += 1
    extra = f", {failed} failed" if failed else ""
    extra += f", {waiting} waiting for a person" if waiting else ""
    return f"pool size {record.config.pool_size}, {counted(made, 'draft')}{extra}"


def merged(record: RunRecord, node: str) -> str:
    """How many replies merge published to out/."""
    files = counted(sum(t.file is not None for t in record.tickets.values()), "file")
    return f"wrote {files} to out/, passing on references and summaries"


def reviewed(record: RunRecord, node: str) -> str:
    """The gate's rewrites over every ticket."""
    return f"gate rewrites: {counted(record.nodes[node].rounds or 0, 'round')} in total"
