"""The tickets of a run a person may have to act on, in one small file (waitlist.json), so
the queue (people/queue.py) reads one file per ended run instead of every record: at 10,000
waiting tickets, opening and parsing 10,000 records is most of the queue page's first
request.

An entry per ticket that is `needs_human`, `awaiting_approval`, or a `pass` while the run's
`[review] audit_share` is above 0 (whether it is sampled, handled or audited is decided by
the reader, from names alone), with what the queue shows of it and when its record was last
written. It is written when a run ends (ending.end) and when an ended run is counted again
(totals.recount), and it is only believed while it is true: it keeps the version of
records/ it was read from, and every save of a record (an append to its file of versions,
workers/versions.py, or a rename into records/) changes the folder's version. A file that
does not match is ignored (the records are read).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import NamedTuple

from orchestrator.errors import GraphError
from orchestrator.run.records import REPORT_SEPARATOR, TicketRecord, TicketStatus
from orchestrator.run.store import RunStore
from workers import versions

FILE = "waitlist.json"
VERSION = 1
# A folder's time can be as coarse as the kernel's clock tick: its version is only taken
# once the last write into it is this much older, so a write during the read changes it.
SETTLED_S = 0.05
# Below this many tickets the queue reads the records in a few milliseconds: no file is
# written, and a run's end never waits for records/ to settle (the demo's 6 tickets).
WORTH_IT = 200
LISTED = frozenset({TicketStatus.NEEDS_HUMAN, TicketStatus.AWAITING_APPROVAL})

Version = tuple[int, int]


class Entry(NamedTuple):
    """One ticket a person may have to act on, as the queue shows it."""

    ticket: str
    status: str
    category: str | None
    stop: str | None
    detail: str | None  # the first line of its error, or of the gate's last report
    summary: str  # a pass's summary (an audit shows it); empty for any other ticket
    call_id: str | None  # the call that waits for a decision (awaiting_approval)
    since: float  # when its record was last written (its verdict), seconds since the epoch


def detail(record: TicketRecord) -> str | None:
    """The first line of the error, or of the gate's last report, that goes with the stop."""
    if record.error:
        return record.error.strip().splitlines()[0] if record.error.strip() else None
    if record.gate_reports:
        return record.gate_reports[-1].split(REPORT_SEPARATOR, 1)[0]
    return None


def read(store: RunStore, audit_share: float) -> list[Entry] | None:
    """The run's entries from waitlist.json; None when there is none, or it is not true of
    the records (or of `audit_share`) any more."""
    try:
        with open(f"{store.dir}/{FILE}", "rb") as handle:
            kept = json.loads(handle.read())
        fresh = (
            kept["version"] == VERSION
            and tuple(kept["records"]) == _version(store)
            and kept["audit_share"] == audit_share
        )
        return [Entry(*row) for row in kept["entries"]] if fresh else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(store: RunStore, smallest: int = WORTH_IT) -> None:
    """Read the run's records and write waitlist.json (under the version they were read at),
    for a run of at least `smallest` tickets.
    A folder that cannot be read or written now is left as it is: the queue reads the
    records instead, as it does for a live run."""
    if (taken := _take(store, smallest)) is not None:
        share, version = taken
        _dump(store, share, version, list(of_records(store, share)))


def materialise(store: RunStore, smallest: int = WORTH_IT) -> None:
    """run-state.json (`RunStore.materialise`) and, for a run of at least `smallest`
    tickets, waitlist.json, from one read of the records: what a run's end writes."""
    if (taken := _take(store, smallest)) is None:
        store.materialise()
        return
    share, version = taken
    entries: list[Entry] = []

    def tapped() -> Iterator[tuple[str, TicketRecord]]:
        for ticket_id, record in store.records():
            if (entry := _entry(store, ticket_id, record, share)) is not None:
                entries.append(entry)  # before run-state.json's view of it is added
            yield ticket_id, record

    store.materialise(tapped())
    _dump(store, share, version, entries)


def _take(store: RunStore, smallest: int) -> tuple[float, Version] | None:
    """The run's audit share and records/'s settled version, when a waitlist is worth
    writing now (None: too few tickets, or the folder cannot be read or is changing)."""
    try:
        if len(os.listdir(f"{store.dir}/records")) < smallest:
            return None
        share = store.meta().config.audit_share
        version = _settled(store)
    except (OSError, GraphError):
        return None
    return None if version is None else (share, version)


def _dump(store: RunStore, share: float, version: Version, entries: list[Entry]) -> None:
    text = json.dumps(
        {"version": VERSION, "records": version, "audit_share": share, "entries": entries}
    )
    try:
        store.write(store.dir / FILE, text, durable=False)
    except (OSError, GraphError):
        return


def of_records(store: RunStore, audit_share: float) -> Iterator[Entry]:
    """The entries, read from every record of the run (what waitlist.json keeps)."""
    for ticket_id, record in records(store):
        if (entry := _entry(store, ticket_id, record, audit_share)) is not None:
            yield entry


def _entry(store: RunStore, ticket_id: str, record: TicketRecord, share: float) -> Entry | None:
    """The ticket's entry, if a person may have to act on it."""
    if not (record.status in LISTED or (record.status is TicketStatus.PASS and share > 0)):
        return None
    return Entry(
        ticket_id,
        record.status.value,
        record.category,
        record.stop,
        detail(record),
        _summary(record),
        record.waiting.call_id if record.waiting is not None else None,
        _mtime(store, ticket_id),
    )


def _summary(record: TicketRecord) -> str:
    """What an audit shows of a pass (nothing for a ticket that did not pass)."""
    if record.status is not TicketStatus.PASS:
        return ""
    return record.summary or record.one_line or ""


def records(store: RunStore) -> Iterator[tuple[str, TicketRecord]]:
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
                record = versions.newest(handle.read(), TicketRecord.model_validate_json)
        except (OSError, ValueError):
            continue  # gone since, or torn: `status` names it
        yield name.removesuffix(".json"), record


def _is_record(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".")


def _mtime(store: RunStore, ticket_id: str) -> float:
    try:  # a string path: pathlib's joins cost more than the stat over 10,000 tickets
        return os.stat(f"{store.dir}/records/{ticket_id}.json").st_mtime
    except OSError:
        return time.time()


def _version(store: RunStore) -> Version | None:
    try:
        stat = os.stat(f"{store.dir}/records")
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_ino


def _settled(store: RunStore) -> Version | None:
    """records/'s version, once its last change is older than the clock's tick (None: it has
    none, or it is still changing)."""
    for wait in (0.0, SETTLED_S):
        time.sleep(wait)
        version = _version(store)
        if version is None or time.time_ns() - version[0] >= SETTLED_S * 1e9:
            return version
    return None
