"""What `run` and `resume` print: progress lines read back from the run record, the report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from orchestrator.records import FAILED_STOPS, RunPhase, RunRecord, TicketStatus
from orchestrator.runstate import RunStore

# Past this many tickets a progress line gives counts, not every id (the full list is in
# run-state.json and the report): a 10,000-ticket run's route line was 200 KB.
LIST_AT_MOST = 20


def claimed(record: RunRecord) -> str:
    """The line printed when the inbox has been claimed."""
    ids = ", ".join(record.tickets) or "none"
    if len(record.tickets) > LIST_AT_MOST:
        ids = f"{next(iter(record.tickets))} … {next(reversed(record.tickets))}"
    line = f"inbox/ received {len(record.tickets)} tickets: {ids}"
    if record.rejected:
        line += f"; {len(record.rejected)} files quarantined (not tickets)"
    return line


def progress(record: RunRecord) -> list[str]:
    """One line per finished node, as in the seed."""
    tickets = record.tickets.values()
    lines = []
    if record.done("route"):
        lines.append(f"[route] {_routes(record)}")
    if record.done("fanout"):
        # A draft that failed leaves no file; a review that failed later still has one.
        failed = sum(t.stop in FAILED_STOPS and t.file is None for t in tickets)
        extra = f", {failed} failed" if failed else ""
        drafted = len(record.tickets) - failed
        lines.append(f"[fanout] pool size {record.config.pool_size}, {drafted} drafts{extra}")
    if record.done("merge"):
        files = sum(t.file is not None for t in tickets)
        lines.append(f"[merge] wrote {files} files to out/, passing on references and summaries")
    if record.done("review"):
        lines.append(f"[review] gate rewrites: {record.nodes['review'].rounds} rounds in total")
    return lines


def _routes(record: RunRecord) -> str:
    """Each ticket's category, or, for many tickets, how many went to each category."""
    if len(record.tickets) <= LIST_AT_MOST:
        return "  ".join(f"{i}={t.category}" for i, t in record.tickets.items())
    counts = Counter(t.category for t in record.tickets.values())
    return f"{len(record.tickets)} tickets: " + "  ".join(f"{c}={n}" for c, n in counts.items())


class ProgressPrinter:
    """Prints each node's progress line once, as soon as the run shows the node done.

    It reads run-state.json only when the run says a node ended (the single-writer steps
    materialise it just before), never on a timer.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.printed: set[str] = set()

    def __call__(self, event: dict[str, Any]) -> None:
        """Print the lines of nodes finished since the last call, on a node's end."""
        if event.get("event") == "node_end":
            self.show(self.store.materialised())

    def show(self, record: RunRecord) -> None:
        """Print the lines of `record`'s finished nodes not printed yet."""
        for line in progress(record):
            node = line.split("]", 1)[0]
            if node not in self.printed:
                self.printed.add(node)
                print(line, flush=True)


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
