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

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from orchestrator.config.workspace import Workspace
from orchestrator.errors import GraphError
from orchestrator.people import audit, money, stops
from orchestrator.run import approvals, verdicts, waitlist
from orchestrator.run.records import RunMeta, TicketStatus
from orchestrator.run.store import RunStore
from orchestrator.run.verdicts import AUDITS, HANDLED

Kind = Literal["call", "ticket", "audit"]
KINDS: tuple[Kind, ...] = ("call", "ticket", "audit")
NEEDS_HUMAN, AWAITING = TicketStatus.NEEDS_HUMAN.value, TicketStatus.AWAITING_APPROVAL.value
PASS = TicketStatus.PASS.value


@dataclass
class Item:
    """One thing that waits for a person (a plain class: a queue builds 10,000 at a time)."""

    kind: Kind
    run_id: str
    ticket: str
    category: str | None
    reason: str  # a code to filter on: the ticket's stop, "approval" or "audit"
    why: str  # the same in words, with its detail
    since: str  # ISO time it began to wait
    age_s: float
    commands: list[str] = field(default_factory=list)
    # A call's own fields.
    call_id: str | None = None
    tool: str | None = None
    args: dict[str, Any] | None = None
    arguments: str | None = None  # the arguments in words, amounts as money
    rule: str | None = None  # what made it wait (the worker's approval policy for the tool)
    expires_at: str | None = None
    state: str | None = None  # waiting, decided (resume finishes it) or expired

    def model_dump(self) -> dict[str, Any]:
        """The item as JSON data (`ticketgraph queue --json`)."""
        return asdict(self)

    def aged(self, age_s: float) -> Item:
        """The same item, `age_s` seconds old (a copy: a cache keeps the item itself)."""
        copied = object.__new__(Item)
        copied.__dict__.update(self.__dict__, age_s=age_s)
        return copied


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
    share = meta.config.audit_share
    entries = waitlist.read(store, share)
    if entries is None:  # none written yet (a live run), or the records changed since
        entries = list(waitlist.of_records(store, share))
    handled = verdicts.tickets_with(store, HANDLED)
    audited = verdicts.tickets_with(store, AUDITS)
    for entry in entries:
        if entry.status == NEEDS_HUMAN and entry.ticket not in handled:
            yield _ticket_item(store.run_id, entry, now)
        elif entry.status == AWAITING and entry.call_id is not None:
            if (call := _call_item(store, meta, entry, now)) is not None:
                yield call
        elif (
            entry.status == PASS
            and entry.ticket not in audited
            and audit.sampled(store.run_id, entry.ticket, share)
        ):
            yield _audit_item(store.run_id, entry, now)


def _parse(stamp: str) -> datetime:
    """An ISO time of the run's files (`Z` for UTC; none is taken as UTC)."""
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _ticket_item(run: str, entry: waitlist.Entry, now: datetime) -> Item:
    verbs = (
        ("handle", "--send"),
        ("handle", "--reply-file FILE"),
        ("handle", "--close --reason '...'"),
    )
    reason = entry.stop or entry.status
    why = stops.worded(entry.stop, entry.detail)
    return _record_item(run, entry, now, "ticket", reason, why, verbs)


def _audit_item(run: str, entry: waitlist.Entry, now: datetime) -> Item:
    why = f"a sampled pass ([review] audit_share): {entry.summary}"
    verbs = ("audit", "--good"), ("audit", "--bad --reason '...'")
    return _record_item(run, entry, now, "audit", "audit", why, verbs)


def _record_item(
    run: str,
    entry: waitlist.Entry,
    now: datetime,
    kind: Kind,
    reason: str,
    why: str,
    verbs: Iterable[tuple[str, str]],
) -> Item:
    """An item that waits since the ticket's verdict; each of `verbs` (a command and its
    options) becomes `ticketgraph <command> <run> <ticket> <options>`."""
    since = datetime.fromtimestamp(entry.since, UTC)
    ticket_id = entry.ticket
    return Item(
        kind,
        run,
        ticket_id,
        entry.category,
        reason,
        why,
        _stamp(since),
        round((now - since).total_seconds(), 1),
        [f"ticketgraph {verb} {run} {ticket_id} {options}" for verb, options in verbs],
    )


def _call_item(store: RunStore, meta: RunMeta, entry: waitlist.Entry, now: datetime) -> Item | None:
    assert entry.call_id is not None
    asked = approvals.request(store, entry.ticket, entry.call_id)
    if asked is None:
        return None
    expire = approvals.expire_s(meta.config)
    standing = approvals.standing(store, asked, expire)
    since = _parse(asked.asked_at)
    worker = meta.config.workers.get(entry.category or "")
    rule = worker.approval.get(asked.tool) if worker is not None else None
    run = store.run_id
    state, why, commands = _call_state(run, entry.ticket, standing)
    return Item(
        kind="call",
        run_id=run,
        ticket=entry.ticket,
        category=entry.category,
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
