"""merge: every draft published to out/<id>.txt in one flush, with references and one-line
summaries (published.json); a plain function, no model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from orchestrator.run import ending, ids
from orchestrator.run.records import TicketStatus
from orchestrator.steps import report
from orchestrator.steps.context import Context


def merge(ctx: Context) -> list[str]:
    """Publish the drafts; return the tickets review should take (none when the run stops
    after merge)."""
    drafted = [i for i, t in ctx.store.records() if t.status is TicketStatus.DRAFTED]
    if not ctx.node_done():
        _publish(ctx, drafted)
    if ctx.meta.config.stop_after == "merge":
        ending.stop_early(ctx.store)
        return []
    return drafted


def _publish(ctx: Context, drafted: list[str]) -> None:
    """Copy drafts to out/ in one flush, and list what was published.

    Ticket records are not rewritten here (that would be N more writes in the one step no
    other can overlap): published.json says which tickets have an out/ file and their
    summaries, and review writes both into each ticket's record when it takes it. Each
    draft is read as its file is written, not all of them first.
    """
    trace = ctx.tracer()
    ctx.open_node()
    workspace = Path(ctx.meta.workspace)
    summaries: dict[str, str] = {}

    def writes() -> Iterator[tuple[Path, str]]:
        for ticket_id in drafted:
            draft_file = ctx.store.draft_path(ticket_id)
            if not draft_file.exists():
                continue
            text = draft_file.read_text(encoding="utf-8")
            summaries[ticket_id] = report.one_line(text)
            yield ids.out_file(workspace, ticket_id), text
            chars = len(text.strip())
            trace.emit("collected", ticket=ticket_id, file=f"out/{ticket_id}.txt", chars=chars)

    ctx.store.write_many(writes())
    ctx.store.save_published(summaries)
    ctx.close_node()
    ctx.store.materialise()
