"""merge: every draft published to out/<id>.txt (a second name of its file in the run
folder), with references and one-line summaries (published.json); a plain function, no model."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.run import ids
from orchestrator.run.records import TicketStatus
from orchestrator.steps import report
from orchestrator.steps.context import Context


def merge(ctx: Context) -> list[str]:
    """Publish the drafts; return the tickets review should take."""
    drafted = [i for i, t in ctx.store.records() if t.status is TicketStatus.DRAFTED]
    if not ctx.node_done():
        _publish(ctx, drafted)
    return drafted


def _publish(ctx: Context, drafted: list[str]) -> None:
    """Publish each draft to out/, and list what was published.

    The drafts are on disk already (drafting wrote each durably): out/<id>.txt is made a
    hard link of drafts/<id>.txt, renamed into place, and out/ flushed once, so publishing
    writes no data and flushes no other file (a copy and a flush of the whole filesystem
    were most of merge's time; a copy is still made where out/ is on another filesystem).
    Review replaces an out/ file it rewrites, and the draft stays as it was.

    Ticket records are not rewritten here (that would be N more writes in the one step no
    other can overlap): published.json says which tickets have an out/ file and their
    summaries, and review writes both into each ticket's record when it takes it.
    """
    ctx.open_node()
    workspace = Workspace(Path(ctx.meta.workspace))
    summaries: dict[str, str] = {}
    links: list[tuple[Path, Path]] = []
    sizes: dict[str, int] = {}
    for ticket_id in drafted:
        draft_file = ctx.store.draft_path(ticket_id)
        try:
            text = draft_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        summaries[ticket_id] = report.one_line(text)
        sizes[ticket_id] = len(text.strip())
        links.append((draft_file, ids.out_file(workspace, ticket_id)))
    ctx.store.link_many(links)
    with ctx.tracer().batched() as trace:
        for ticket_id, chars in sizes.items():
            trace.emit("collected", ticket=ticket_id, file=ids.out_name(ticket_id), chars=chars)
    ctx.store.save_published(summaries)
    ctx.close_node()
    ctx.store.materialise()
