"""A person's verdict on a ticket of a run, as the run folder keeps it: a file created once.

    runs/<run>/handled/<ticket>.json   sent, edited or closed (ticketgraph handle)
    runs/<run>/audits/<ticket>.json    audit_good or audit_bad (ticketgraph audit)

A second verdict of the same kind on the same ticket of the same run is refused, naming the
first. The report and `status` read them here; people/verdicts.py makes them and the labels
they leave."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from orchestrator.errors import UsageError
from orchestrator.run import ids
from orchestrator.run.store import RunStore

Verdict = Literal["sent", "edited", "closed", "audit_good", "audit_bad"]

HANDLED, AUDITS = "handled", "audits"


class PersonVerdict(BaseModel):
    """What a person decided about a run's reply to one ticket."""

    run_id: str
    ticket: str
    verdict: Verdict
    by: str
    at: str
    reason: str | None = None
    draft_sha256: str  # the run's own reply, as it was judged
    final_sha256: str | None = None  # what went out (None: nothing did)
    out_file: str | None = None  # where it was published, relative to the workspace


def _path(store: RunStore, folder: str, ticket_id: str) -> Path:
    return store.dir / folder / f"{ids.ticket(ticket_id)}.json"


def read(store: RunStore, folder: str, ticket_id: str) -> PersonVerdict | None:
    """The verdict of this kind on the ticket, if one was recorded and can be read."""
    try:
        return PersonVerdict.model_validate_json(_path(store, folder, ticket_id).read_bytes())
    except (FileNotFoundError, ValidationError):
        return None


def all_of(store: RunStore, folder: str) -> dict[str, PersonVerdict]:
    """Every verdict of this kind in the run, by ticket."""
    found = {}
    for path in sorted((store.dir / folder).glob("*.json")):
        try:
            made = PersonVerdict.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            continue
        found[made.ticket] = made
    return found


def tickets_with(store: RunStore, folder: str) -> set[str]:
    """The tickets of the run with a verdict of this kind (names only: nothing parsed)."""
    return {p.name.removesuffix(".json") for p in (store.dir / folder).glob("*.json")}


def record(store: RunStore, folder: str, made: PersonVerdict) -> None:
    """Write the verdict, once: `UsageError` naming the earlier one if there is one."""
    path = _path(store, folder, made.ticket)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        earlier = read(store, folder, made.ticket)
        said = f" ({earlier.verdict} by {earlier.by} at {earlier.at})" if earlier else ""
        what = "handled" if folder == HANDLED else "audited"
        raise UsageError(f"{made.ticket} of run {store.run_id} was {what} already{said}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(made.model_dump_json())
        handle.flush()
        os.fsync(handle.fileno())
