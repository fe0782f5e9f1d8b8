"""One queue of what waits for a person, across every run of a workspace, read from the run
folders alone (no Redis, no workers):

    call     a tool call that waits for a decision (or was decided and waits for `resume`)
    ticket   a `needs_human` ticket nobody handled yet (ticketgraph handle)
    audit    a pass sampled by `[review] audit_share` nobody audited yet (ticketgraph audit)

Each item says where (run, ticket), why in words, since when, and for a call the tool, its
arguments in words (amounts as money), the rule that made it wait and when it expires. The
queue drains as items are handled: a handled ticket, an audited pass or a call whose ticket
was resumed is no longer in it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from orchestrator.config.workspace import Workspace
from orchestrator.errors import GraphError
from orchestrator.people import audit, money, stops
from orchestrator.run import approvals, verdicts
from orchestrator.run.records import RunMeta, TicketRecord, TicketStatus
from orchestrator.run.store import RunStore
from orchestrator.run.verdicts import AUDITS, HANDLED

Kind = Literal["call", "ticket", "audit"]
KINDS: tuple[Kind, ...] = ("call", "ticket", "audit")


class Item(BaseModel):
    """One thing that waits for a person."""

    kind: Kind
    run_id: str
    ticket: str
    category: str | None = None
    reason: str  # a code to filter on: the ticket's stop, "approval" or "audit"
    why: str  # the same in words, with its detail
    since: str  # ISO time it began to wait
    age_s: float
    commands: list[str] = []
    # A call's own fields.
    call_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    arguments: str | None = None  # the arguments in words, amounts as money
    rule: str | None = None  # what made it wait (the worker's approval policy for the tool)
    expires_at: str | None = None
    state: str | None = None  # waiting, decided (resume finishes it) or expired


@dataclass(frozen=True)
class Filters:
    """Which items to show (None: any)."""

    kind: str | None = None
    reason: str | None = None
    category: str | None = None
    run_id: str | None = None
    older_than_s: float | None = None
    newest_first: bool = False

    def keep(self, item: Item) -> bool:
        """True when `item` passes every filter given."""
        return (
            self.kind in (None, item.kind)
            and self.reason in (None, item.reason)
            and self.category in (None, item.category)
            and self.run_id in (None, item.run_id)
            and (self.older_than_s is None or item.age_s >= self.older_than_s)
        )


def items(workspace: Workspace, filters: Filters | None = None) -> list[Item]:
    """What waits for a person in every run of the workspace, oldest first (or newest)."""
    filters = filters or Filters()
    now = datetime.now(UTC)
    found = [i for i in _all(workspace, now, filters.run_id) if filters.keep(i)]
    return sorted(found, key=lambda i: (i.since, i.run_id, i.ticket), reverse=filters.newest_first)


def age_words(seconds: float) -> str:
    """An age a person reads at a glance: 45 s, 12 min, 3.5 h, 2.1 d."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def counts(found: Iterable[Item]) -> dict[str, int]:
    """How many items of each kind."""
    total = dict.fromkeys(KINDS, 0)
    for item in found:
        total[item.kind] += 1
    return total


def _all(workspace: Workspace, now: datetime, run_id: str | None) -> Iterator[Item]:
    for run_dir in sorted((workspace.runs).glob(run_id or "run-*")):
        yield from of_run(run_dir, now)


def of_run(run_dir: Path, now: datetime | None = None) -> list[Item]:
    """What waits for a person in one run folder (nothing for a folder that is not a run
    yet, or cannot be read: `runs` lists it as such)."""
    store = RunStore(run_dir)
    try:
        meta = store.meta()
    except (GraphError, OSError, ValueError):
        return []
    if _nothing_waits(meta):
        return []
    return list(_of_run(store, meta, now or datetime.now(UTC)))


def _nothing_waits(meta: RunMeta) -> bool:
    """True when an ended run's totals show nothing a person could be waited for (its
    records are then not read)."""
    if meta.totals is None:
        return False
    by_status = meta.totals.by_status
    waiting = by_status.get(TicketStatus.NEEDS_HUMAN, 0) + by_status.get(
        TicketStatus.AWAITING_APPROVAL, 0
    )
    return not waiting and not (meta.config.audit_share > 0 and by_status.get("pass"))


def _of_run(store: RunStore, meta: RunMeta, now: datetime) -> Iterator[Item]:
    handled = verdicts.tickets_with(store, HANDLED)
    audited = verdicts.tickets_with(store, AUDITS)
    for ticket_id, record in _records(store):
        if record.status is TicketStatus.NEEDS_HUMAN and ticket_id not in handled:
            yield _ticket_item(store, ticket_id, record, now)
        elif record.status is TicketStatus.AWAITING_APPROVAL and record.waiting is not None:
            if (call := _call_item(store, meta, ticket_id, record, now)) is not None:
                yield call
        elif (
            record.status is TicketStatus.PASS
            and ticket_id not in audited
            and audit.sampled(store.run_id, ticket_id, meta.config.audit_share)
        ):
            yield _audit_item(store, ticket_id, record, now)


def _records(store: RunStore) -> Iterator[tuple[str, TicketRecord]]:
    """Every readable record of the run, by id, read straight from records/: a claimed
    record (the only kind route's decision is shown in) never waits for a person, and at
    10,000 tickets pathlib's joins in `RunStore.records` cost as much as the parsing."""
    folder = f"{store.dir}/records"
    try:
        names = sorted(e.name for e in os.scandir(folder) if _is_record(e.name))
    except FileNotFoundError:
        return
    for name in names:
        try:
            with open(f"{folder}/{name}", "rb") as handle:
                record = TicketRecord.model_validate_json(handle.read())
        except (OSError, ValueError):
            continue  # gone since, or torn: `status` names it
        yield name.removesuffix(".json"), record


def _is_record(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def _since(store: RunStore, ticket_id: str) -> datetime:
    """When the ticket's record was last written: when its verdict was reached."""
    try:  # a string path: pathlib's joins cost more than the stat over 10,000 tickets
        stamp = os.stat(f"{store.dir}/records/{ticket_id}.json").st_mtime
    except OSError:
        return datetime.now(UTC)
    return datetime.fromtimestamp(stamp, UTC)


def _parse(stamp: str) -> datetime:
    """An ISO time of the run's files (`Z` for UTC; none is taken as UTC)."""
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _ticket_item(store: RunStore, ticket_id: str, record: TicketRecord, now: datetime) -> Item:
    reason = record.stop or record.status.value
    verbs = (
        ("handle", "--send"),
        ("handle", "--reply-file FILE"),
        ("handle", "--close --reason '...'"),
    )
    return _record_item(
        store, ticket_id, record, now, "ticket", reason, stops.reason(record), verbs
    )


def _audit_item(store: RunStore, ticket_id: str, record: TicketRecord, now: datetime) -> Item:
    why = f"a sampled pass ([review] audit_share): {record.summary or record.one_line or ''}"
    verbs = ("audit", "--good"), ("audit", "--bad --reason '...'")
    return _record_item(store, ticket_id, record, now, "audit", "audit", why, verbs)


def _record_item(
    store: RunStore,
    ticket_id: str,
    record: TicketRecord,
    now: datetime,
    kind: Kind,
    reason: str,
    why: str,
    verbs: Iterable[tuple[str, str]],
) -> Item:
    """An item that waits since the ticket's verdict; each of `verbs` (a command and its
    options) becomes `ticketgraph <command> <run> <ticket> <options>`."""
    since = _since(store, ticket_id)
    run = store.run_id
    return Item(
        kind=kind,
        run_id=run,
        ticket=ticket_id,
        category=record.category,
        reason=reason,
        why=why,
        since=_stamp(since),
        age_s=round((now - since).total_seconds(), 1),
        commands=[f"ticketgraph {verb} {run} {ticket_id} {options}" for verb, options in verbs],
    )


def _call_item(
    store: RunStore, meta: RunMeta, ticket_id: str, record: TicketRecord, now: datetime
) -> Item | None:
    waiting = record.waiting
    assert waiting is not None
    asked = approvals.request(store, ticket_id, waiting.call_id)
    if asked is None:
        return None
    expire = approvals.expire_s(meta.config)
    standing = approvals.standing(store, asked, expire)
    since = _parse(asked.asked_at)
    worker = meta.config.workers.get(record.category or "")
    rule = worker.approval.get(asked.tool) if worker is not None else None
    run = store.run_id
    state, why, commands = _call_state(run, ticket_id, standing)
    return Item(
        kind="call",
        run_id=run,
        ticket=ticket_id,
        category=record.category,
        reason="approval",
        why=why,
        since=asked.asked_at,
        age_s=round((now - since).total_seconds(), 1),
        commands=commands,
        call_id=asked.call_id,
        tool=asked.tool,
        args=asked.args,
        arguments=money.words(asked.args),
        rule=rule,
        expires_at=_stamp(since + timedelta(seconds=expire)),
        state=state,
    )


def _call_state(
    run: str, ticket_id: str, standing: approvals.Standing
) -> tuple[str, str, list[str]]:
    """A call's state, why it waits in words, and the commands that move it on."""
    call = standing.request.call_id
    if standing.decided is not None:
        made = standing.decided
        verdict = "approved" if made.approved else "rejected"
        return (
            "decided",
            f"{verdict} by {made.by} at {made.at}: resume the run to finish the ticket",
            [f"ticketgraph resume {run}"],
        )
    if standing.expired:
        return (
            "expired",
            "it waited past [approvals] expire_h undecided: resume ends it needs_human",
            [f"ticketgraph resume {run}", f"ticketgraph requeue {run} {ticket_id} --force"],
        )
    why = f"{standing.request.tool} waits for a person's decision"
    if standing.void is not None:
        why += f" (a decision file does not count: {standing.void})"
    return (
        "waiting",
        why,
        [
            f"ticketgraph approve {run} {ticket_id} --call {call}",
            f"ticketgraph reject {run} {ticket_id} --call {call} --reason '...'",
        ],
    )
