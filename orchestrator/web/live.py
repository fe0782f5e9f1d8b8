"""What a live run's tickets paid that their records do not say yet, and which step is at
work on them: a record is written when a step ends, so a ticket being drafted reads
`routed` and $0 though its worker paid a turn. Every paid turn is in the agent's saved
state (agents/<ticket>.<step>.json, saved before the step goes on), so a row shows, per
figure, the larger of its record's and its agents' (as run/totals.py counts a run that
ended mid-step), and the run's summary — the sum of the rows — says the same.

Cheap on a large run: one listing of agents/ a view; only the files of tickets whose record
is not final are looked at, and only those that changed since are read (and then only their
three figures, not the transcript).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from pydantic_core import from_json

from orchestrator.run.records import TicketStatus
from workers import versions

# A ticket in one of these has its verdict: no step works on it any more.
FINAL = frozenset({TicketStatus.PASS.value, TicketStatus.NEEDS_HUMAN.value})
BEFORE_DRAFT = frozenset({TicketStatus.CLAIMED.value, TicketStatus.ROUTED.value})
DRAFTING, IN_REVIEW = "drafting", "in review"
# An agent's step (`draft`, `draft-<angle>`, `review-<k>`, `evaluate-<k>`) -> what it does.
DOING = {"draft": DRAFTING, "review": IN_REVIEW, "evaluate": IN_REVIEW}


class Paid(NamedTuple):
    """What one agent state says it paid, and when it was saved."""

    calls: int
    tokens: int
    cost_usd: float
    saved_ns: int


Key = tuple[int, int, int]


def at_work(agents: Path, rows: list[Any], known: dict[str, tuple[Key, Paid]]) -> list[Any]:
    """`rows` (catalog.TicketRow, by id) with what their agents paid added where their records
    do not count it yet, and `at_work` set where a step works on them; `known` is the cache
    of agent states read (file name -> its key and what it paid), updated in place."""
    open_rows = {row.id: row for row in rows if row.status not in FINAL}
    if not open_rows:
        known.clear()
        return rows
    by_ticket = _paid(agents, open_rows, known)
    if not by_ticket:
        return rows
    return [_row(row, by_ticket[row.id]) if row.id in by_ticket else row for row in rows]


def _paid(
    agents: Path, open_rows: dict[str, Any], known: dict[str, tuple[Key, Paid]]
) -> dict[str, dict[str, Paid]]:
    """Ticket -> its agents' states (step -> what it paid), for the tickets in `open_rows`."""
    try:
        entries = list(os.scandir(agents))
    except FileNotFoundError:
        return {}
    seen: dict[str, tuple[Key, Paid]] = {}
    by_ticket: dict[str, dict[str, Paid]] = {}
    for entry in entries:
        stem, dot, step = entry.name.removesuffix(".json").rpartition(".")
        if not dot or stem not in open_rows or not entry.name.endswith(".json"):
            continue
        try:
            stat = entry.stat()
            key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            cached = known.get(entry.name)
            if cached is None or cached[0] != key:
                cached = (key, _read(entry.path, stat.st_mtime_ns))
        except (OSError, ValueError, AttributeError, TypeError):
            cached = known.get(entry.name)  # mid-replace or torn for a moment: keep the last
            if cached is None:
                continue
        seen[entry.name] = cached
        by_ticket.setdefault(stem, {})[step] = cached[1]
    known.clear()
    known.update(seen)
    return by_ticket


def _read(path: str, saved_ns: int) -> Paid:
    state = versions.read(path, from_json)
    usage = state.get("usage") or {}
    tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    return Paid(int(usage.get("requests", 0)), tokens, float(state.get("cost_usd", 0.0)), saved_ns)


def _row(row: Any, states: dict[str, Paid]) -> Any:
    """The row with, per figure, the larger of its record's and its agents' sum, and what a
    step does with it now."""
    calls = sum(p.calls for p in states.values())
    tokens = sum(p.tokens for p in states.values())
    cost = sum(p.cost_usd for p in states.values())
    return row._replace(
        calls=max(row.calls, calls),
        tokens=max(row.tokens, tokens),
        cost_usd=round(max(row.cost_usd, cost), 8),
        at_work=_doing(row.status, states, calls > row.calls),
    )


def _doing(status: str, states: dict[str, Paid], paid_more: bool) -> str:
    """What a step does with a ticket of record `status` whose agents are `states`: drafting
    once its draft's agent exists, in review once a rewrite's or the evaluator's does; a
    ticket that waited for a person and was taken up again by `resume`, by the agent that
    paid last. "" when none is at work on it."""
    kinds = {DOING.get(step.partition("-")[0], "") for step in states}
    if status in BEFORE_DRAFT and DRAFTING in kinds:
        return DRAFTING
    if status == TicketStatus.DRAFTED.value and IN_REVIEW in kinds:
        return IN_REVIEW
    if status == TicketStatus.AWAITING_APPROVAL.value and paid_more:
        newest = max(states, key=lambda step: states[step].saved_ns)
        return DOING.get(newest.partition("-")[0], "")
    return ""
