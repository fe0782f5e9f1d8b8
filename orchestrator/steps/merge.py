"""merge: every draft published to out/<id>.txt in one flush, with references and one-line
summaries (published.json); a plain function, no model."""

from __future__ import annotations

from pathlib import Path

from orchestrator.run import ending, ids
from orchestrator.run.records import TicketRecord, TicketStatus
from orchestrator.steps import report
from orchestrator.steps.context import Context


def merge(ctx: Context) -> list[str]:
    """Publish the drafts; return the tickets review should take (none when the run stops
    after merge)."""
    tickets = ctx.store.tickets()
    if not ctx.node_done():
        _publish(ctx, tickets)
    if ctx.meta.config.stop_after == "merge":
        ending.stop_early(ctx.store, tickets)
        return []
    return [i for i, t in tickets.items() if t.status is TicketStatus.DRAFTED]


def _publish(ctx: Context, tickets: dict[str, TicketRecord]) -> None:
    """Copy drafts to out/ in one flush, and list what was published.

    Ticket records are not rewritten here (that would be N more writes in the one step no
    other can overlap): published.json says which tickets have an out/ file and their
    summaries, and review writes both into each ticket's record when it takes it.
    """
    trace = ctx.tracer()
    ctx.open_node()
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
    ctx.close_node()
    ctx.store.materialise(tickets)
