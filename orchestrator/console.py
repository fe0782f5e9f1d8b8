"""What `run` and `resume` print: progress lines read back from the run record, the report."""

from __future__ import annotations

from orchestrator.runstate import RunPhase, RunRecord, RunStore, TicketStatus


def claimed(record: RunRecord) -> str:
    """The line printed when the inbox has been claimed."""
    ids = ", ".join(record.tickets) or "none"
    return f"inbox/ received {len(record.tickets)} tickets: {ids}"


def progress(record: RunRecord) -> list[str]:
    """One line per finished node, as in the seed."""
    lines = []
    tickets = record.tickets.values()
    if "route" in record.nodes:
        routes = "  ".join(f"{i}={t.category}" for i, t in record.tickets.items())
        lines.append(f"[route] {routes}")
    if record.nodes.get("fanout", None) and record.nodes["fanout"].status == "ok":
        drafted = sum(t.draft.calls > 0 or t.handler == "template" for t in tickets)
        failed = sum(t.stop == "worker_failed" and t.file is None for t in tickets)
        extra = f", {failed} failed" if failed else ""
        lines.append(f"[fanout] pool size {record.config.pool_size}, {drafted} drafts{extra}")
    if record.nodes.get("merge") and record.nodes["merge"].status == "ok":
        files = sum(t.file is not None for t in tickets)
        lines.append(
            f"[merge] wrote {files} files to out/, passing on references and one-line summaries"
        )
    if record.nodes.get("review") and record.nodes["review"].status == "ok":
        lines.append(f"[review] gate rewrites: {record.nodes['review'].rounds} rounds in total")
    return lines


def outcome(store: RunStore, record: RunRecord) -> str:
    """The report, the stop notice, or the crash, whichever ended the run."""
    if record.status is RunPhase.DONE and store.report_path.exists():
        return store.report_path.read_text(encoding="utf-8")
    if record.status is RunPhase.STOPPED:
        drafted = sum(t.status is TicketStatus.DRAFTED for t in record.tickets.values())
        why = record.error or "stopped after merge"
        return (
            f"[stop] {why}: {drafted} tickets drafted, no verdict in this run.\n"
            f"Resume with: ticketgraph resume {record.run_id}\n"
        )
    if record.status is RunPhase.RUNNING:
        return (
            f"[wait] stopped waiting; run {record.run_id} goes on in the workers. "
            f"Its state: runs/{record.run_id}/run-state.json\n"
        )
    return (
        f"run {record.run_id}: {record.status.value}"
        + (f" ({record.error})" if record.error else "")
        + "\n"
    )
