"""report: the run's verdict and exit code, and the report it prints: the seed's two tables,
the needs-human list, and where the trace is. A plain function, no model."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from orchestrator.config.workspace import DEMO_SCENARIOS
from orchestrator.coordination import budget as budget_ledger
from orchestrator.exit_codes import ExitCode
from orchestrator.run.records import (
    FAILED_STOPS,
    BudgetTotals,
    NodeRecord,
    RunRecord,
    RunStatus,
    TicketRecord,
    TicketStatus,
    Vote,
    WaitingCall,
    spent,
)
from orchestrator.run.store import ROUTE_NODE
from orchestrator.steps.context import Context
from orchestrator.steps.routing import OTHER, TO_FILL

ONE_LINE_CHARS = 22
SUMMARY_CHARS = 100


def one_line(text: str) -> str:
    """The first sentence, cut to 22 characters with an ellipsis (as in the seed)."""
    head = " ".join(text.strip().split(".")[0].split())
    return f"{head[:ONE_LINE_CHARS]}…" if len(head) > ONE_LINE_CHARS else head


def summary(text: str) -> str:
    """The reply's first sentence (a full stop followed by a space ends it, so 399.00 does
    not), up to SUMMARY_CHARS characters: what the report shows a person."""
    head = " ".join(re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0].split())
    return f"{head[:SUMMARY_CHARS]}…" if len(head) > SUMMARY_CHARS else head


def _row(cells: list[str], widths: list[int]) -> str:
    return "".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=False)).rstrip()


def table(rows: list[list[str]], least: list[int]) -> list[str]:
    """Rows (the header first) in columns `least` wide, or as wide as their longest cell
    and one space, so that no two cells run together."""
    widths = [max([w, *(len(row[i]) + 1 for row in rows)]) for i, w in enumerate(least)]
    return [_row(row, widths) for row in rows]


_NODE_WIDTHS = [10, 9, 7, 8, 8, 8, 10]


def node_table(record: RunRecord) -> list[str]:
    """Per node: time, model calls, tokens, rounds (review only), status."""
    rows = [["Node", "Time", "Calls", "Tokens", "Rounds", "Status", "Cost"]]
    for name in record.config.nodes:
        node = record.nodes.get(name)
        if node is None:
            continue
        rounds = node.rounds if node.rounds is not None else "-"
        spent_usd = usd(node.cost_usd, node.estimated)
        status = _node_status(record, node)
        cells = [name, f"{node.ms}ms", node.calls, node.tokens, rounds, status, spent_usd]
        rows.append([str(c) for c in cells])
    estimated = sum(n.estimated for n in record.nodes.values())
    return [
        "=== Graph run summary ===",
        *table(rows, _NODE_WIDTHS),
        f"Cost of the run: {usd(cost(record), estimated)}" + _estimated_note(estimated),
    ]


def _node_status(record: RunRecord, node: NodeRecord) -> str:
    """A node's status; one left open by a run that is no longer running stopped with it."""
    if node.done or record.status is RunStatus.RUNNING:
        return node.status
    return "crashed" if record.status is RunStatus.CRASHED else "stopped"


def usd(amount: float, estimated: int = 0) -> str:
    """Dollars to the hundredth of a cent, half up, with `~` when some usage was our own
    count. Every place that shows a cost (report, console, web) rounds here: the same sum
    added in another order differs in its last float bits, and `:.4f` on a value at a
    half (0.01675) then gives 0.0167 in one place and 0.0168 in another."""
    shown = Decimal(repr(round(amount, 9))).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)
    return f"{'~' if estimated else ''}${shown + 0}"  # + 0: never a "-0.0000"


def _estimated_note(estimated: int) -> str:
    if not estimated:
        return ""
    replies = counted(estimated, "reply", "replies")
    return f" (~: {replies} came without usage; counted with o200k_base)"


def counted(count: int, one: str, many: str | None = None) -> str:
    """`1 reply`, `2 replies`: the count and the noun it takes (`one` + s if no `many`)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


_TICKET_WIDTHS = [9, 10, 17, 8, 15, 12, 10]
TICKET_TITLE = "=== Per ticket ==="
TICKET_COLUMNS = ["Ticket", "Category", "Handler", "Rounds", "Stop", "Status", "Cost"]


def ticket_cells(ticket_id: str, t: TicketRecord) -> list[str]:
    """One ticket's cells of the per-ticket table: category, handler, rounds, stop reason,
    status, cost (what every step paid for it)."""
    spent = t.total()
    cells = [ticket_id, t.category or "-", t.handler or "-", str(t.gate_rounds), t.stop or "-"]
    return [*cells, t.status.value, usd(spent.cost_usd, spent.estimated)]


def cost(record: RunRecord) -> float:
    """USD the run has paid (see `paid`)."""
    return float(paid(record)["cost_usd"])


def paid(record: RunRecord) -> dict[str, Any]:
    """The run's model calls, tokens and USD (`calls`, `tokens`, `cost_usd`): once it
    ended, its totals (run/totals.py: what its agents saved, however it ended); while it
    runs, what its nodes and its tickets' records say so far."""
    if record.status is not RunStatus.RUNNING and record.totals is not None:
        return record.totals.model_dump(include={"calls", "tokens", "cost_usd"})
    nodes = {name: node.model_dump() for name, node in record.nodes.items()}
    tickets = (t.total() for t in record.tickets.values())
    used = ((u.calls, u.tokens, u.cost_usd) for u in tickets)
    return spent(nodes.values(), nodes.get(ROUTE_NODE, {}), used)


def budget(record: RunRecord) -> BudgetTotals:
    """What the run may spend and has spent: the ledger as last copied into run.json (the
    end of the run, the report) while it has a budget, else what the run paid (`paid`: a
    ledger Redis lost is not copied); and the requests that waited for the endpoint's cap."""
    waited = sum(n.waited for n in record.nodes.values())
    limit = record.config.run_budget_usd
    if record.budget is not None and limit is not None:  # the limit: resume may have raised it
        left = round(max(limit - record.budget.settled_usd - record.budget.reserved_usd, 0), 9)
        return record.budget.model_copy(
            update={"calls_waited": waited, "limit_usd": limit, "remaining_usd": left}
        )
    spent_now = paid(record)
    settled = spent_now["cost_usd"]
    remaining = None if limit is None else round(max(limit - settled, 0.0), 8)
    return BudgetTotals(
        limit_usd=limit,
        reserved_usd=0.0,
        settled_usd=settled,
        remaining_usd=remaining,
        calls=spent_now["calls"],
        estimated=sum(n.estimated for n in record.nodes.values()),
        calls_waited=waited,
    )


def budget_line(totals: BudgetTotals) -> str | None:
    """`budget: $0.0336 of $0.0500 (...)` for a run with a budget or requests that waited."""
    parts = []
    if totals.limit_usd is not None:
        parts.append(
            f"budget: ${totals.settled_usd:.4f} settled of ${totals.limit_usd:.4f}, "
            f"${totals.reserved_usd:.4f} held, ${totals.remaining_usd or 0:.4f} left"
        )
        if totals.refused:
            parts.append(f"calls not started for want of it: {totals.refused}")
    if totals.calls_waited:
        parts.append(f"requests that waited for the endpoint's cap: {totals.calls_waited}")
    return "; ".join(parts) or None


def render(record: RunRecord, tickets: Iterable[tuple[str, TicketRecord]] | None = None) -> str:
    """The whole report as printed at the end of a run. `tickets`: the records, if not in
    `record` (a whole-run step reads them one at a time: `RunStore.shown`), in one pass."""
    return rendered(record, tickets)[0]


def rendered(
    record: RunRecord,
    tickets: Iterable[tuple[str, TicketRecord]] | None = None,
    handled: Mapping[str, Any] | None = None,
) -> tuple[str, int]:
    """The report (`render`) and how many tickets need a human, from one pass; a ticket a
    person handled since (`handled`: ticket -> its record, run/verdicts.py) is listed
    apart and still counted (the run's verdict does not change after it)."""
    handled = handled or {}
    rows: list[list[str]] = [TICKET_COLUMNS]
    needs_human: list[tuple[str, TicketRecord]] = []
    clamped: list[tuple[str, str | None]] = []
    voted: list[tuple[str, Vote]] = []
    published = 0
    for ticket_id, t in record.tickets.items() if tickets is None else tickets:
        rows.append(ticket_cells(ticket_id, t))
        published += t.file is not None
        if t.status is not TicketStatus.PASS:
            needs_human.append((ticket_id, t))
        if t.routing == "clamped":
            clamped.append((ticket_id, t.routed_as))
        if t.vote is not None:
            voted.append((ticket_id, t.vote))
    lines = [*node_table(record)]
    if (line := budget_line(budget(record))) is not None:
        lines.append(line)
    lines += ["", TICKET_TITLE, *table(rows, _TICKET_WIDTHS), ""]
    replies, humans = counted(published, "reply", "replies"), counted(len(needs_human), "ticket")
    done = sum(ticket_id in handled for ticket_id, _ in needs_human)
    lines.append(
        f"out/: {replies}; need a human: {humans}" + (f" ({done} handled)" if done else "")
    )
    for ticket_id, t in needs_human:
        if ticket_id in handled:
            continue
        if t.waiting is not None:
            lines += waiting_lines(record.run_id, ticket_id, t.waiting)
            continue
        detail = f"error: {t.error}" if t.stop in FAILED_STOPS or t.error else t.summary
        lines.append(f"  - {ticket_id} ({t.stop or t.status.value}): {detail or t.one_line}")
        if t.gate_reports:
            lines.append(f"      gate: {t.gate_reports[-1]}")
    lines += handled_lines(handled)
    lines += _clamped_lines(clamped)
    lines += voted_lines(voted)
    if record.rejected:
        files = counted(
            len(record.rejected), "file that is not a ticket", "files that are not tickets"
        )
        lines.append(f"quarantine/: {files}")
        lines += [f"  - {r.file}: {r.reason}" for r in record.rejected]
    lines.append(trace_line(record.run_id))
    return "\n".join(lines) + "\n", len(needs_human)


def handled_lines(handled: Mapping[str, Any]) -> list[str]:
    """The tickets a person handled: what they did, who, when and why."""
    if not handled:
        return []
    lines = [f"handled by a person: {len(handled)}"]
    for ticket_id, made in sorted(handled.items()):
        why = f": {made.reason}" if made.reason else ""
        lines.append(f"  - {ticket_id}: {made.verdict} by {made.by} at {made.at}{why}")
    return lines


def _clamped_lines(clamped: list[tuple[str, str | None]]) -> list[str]:
    """The tickets routed to other for an unknown label, and what the router said."""
    if not clamped:
        return []
    lines = [f"routed to {OTHER} for want of a category: {len(clamped)}"]
    lines += [f"  - {i}: the router said {routed_as!r}" for i, routed_as in clamped]
    if any(routed_as == TO_FILL for _, routed_as in clamped):
        lines.append(
            f"    ({TO_FILL} is what `ticketgraph scenarios init` wrote: put each ticket's "
            f"category in its place in {DEMO_SCENARIOS})"
        )
    return lines


def voted_lines(voted: list[tuple[str, Vote]]) -> list[str]:
    """The tickets drafted from several angles: the angle each went on with, and why."""
    if not voted:
        return []
    lines = [f"voted between a worker's angles: {counted(len(voted), 'ticket')}"]
    lines += [f"  - {i}: angle {v.angle}, {v.why}" for i, v in voted]
    return lines


TRACE = "Trace: "


def trace_line(run_id: str, workspace: str = ".") -> str:
    """Where the run's state and trace are, from the workspace (or from `workspace`'s
    parent, as a path to it)."""
    run_dir = os.path.normpath(os.path.join(workspace, "runs", run_id))
    return f"{TRACE}{run_dir}/run-state.json / {run_dir}/run.jsonl (run_id={run_id})"


def waiting_lines(run_id: str, ticket_id: str, call: WaitingCall) -> list[str]:
    """A ticket whose worker waits for a person, and the commands that decide its call."""
    command = f"{run_id} {ticket_id} --call {call.call_id}"
    arguments = json.dumps(call.args, ensure_ascii=False)
    return [
        f"  - {ticket_id} (awaiting_approval): {call.tool}({arguments}) waits for a person",
        f"      ticketgraph approve {command}",
        f"      ticketgraph reject {command} --reason '...'",
        f"      then: ticketgraph resume {run_id}",
    ]


def exit_code(needs_human: int, rejected: bool) -> ExitCode:
    """The exit code of a run's verdict: 1 if a ticket needs a human or a claimed file was
    not a ticket (someone must look), else 0."""
    return ExitCode.NEEDS_HUMAN if needs_human or rejected else ExitCode.ALL_PASS


def report(ctx: Context) -> int:
    """Render the report and return the exit code of the run's verdict (the task layer
    ends the run with it)."""
    meta = ctx.store.meta()
    if meta.status is RunStatus.DONE and meta.exit_code is not None:
        return meta.exit_code
    ctx.open_node()
    if ctx.redis is not None:
        budget_ledger.snapshot(ctx.redis, ctx.store)
    # Each record is read as its line is rendered, not all of them first.
    # Tickets a person handled before a resume (run/verdicts.py) stay listed apart.
    from orchestrator.run import verdicts

    handled = verdicts.all_of(ctx.store, verdicts.HANDLED)
    text, needs_human = rendered(ctx.store.read({}), ctx.store.shown(), handled)
    code = exit_code(needs_human, bool(meta.rejected))
    ctx.store.write(ctx.store.report_path, text)
    ctx.close_node()
    return code
