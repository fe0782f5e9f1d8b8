"""The workspace's effect ledger: every tool write of every run, kept beside runs/ so that
it outlives them, and what a ticket's calls' idempotency keys are made of.

    ledger/id                  the workspace's id (made once; part of every key)
    ledger/writes/<key>.json   one write: intent, outcome, run (workers/effects.py)
    ledger/repeats/<ticket>.json
                               who asked for the ticket's writes to be made again
                               (`requeue --repeat-writes`), and when

A ticket's key base is its workspace, its id, its text's hash, how many times a person
asked its writes to be repeated and the agent (draft, review-k): none of these changes on
resume, redelivery or requeue, so a requeued ticket's refund has the key it had and is
answered from the ledger. `--repeat-writes` adds a repeat: every key of the ticket changes,
and its writes run again, each with a new key.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from orchestrator.run import fence
from orchestrator.run.store import RunStore
from orchestrator.run.workspace import Workspace
from workers import atomic
from workers.effects import Ledger, Write, writes
from workers.fence import UNFENCED, Fence
from workers.trace import now_iso

FOLDER = "ledger"


class Repeat(BaseModel):
    """A person's request that a ticket's writes be made again."""

    by: str
    at: str
    run_id: str  # the run whose ticket was requeued


class Repeats(BaseModel):
    """Every repeat asked for one ticket, oldest first."""

    asked: list[Repeat] = []


def workspace_id(workspace: Workspace) -> str:
    """The workspace's id, made the first time it is asked for (every machine that sees
    the workspace reads the same one; its path may differ between them). A process reads
    the file once and then only looks that it is still the same file (one stat, not the
    three round trips to the volume a ticket it cost, #51): a workspace made again at the
    same path has a new id file, and its new id is read."""
    path = workspace.root / FOLDER / "id"
    try:
        found = os.stat(path)
    except FileNotFoundError:
        _make_id(path)
        found = os.stat(path)
    key = (found.st_dev, found.st_ino, found.st_ctime_ns)  # an inode number may be reused
    if (known := _ids.get(key)) is None:
        _ids[key] = known = path.read_text(encoding="utf-8").strip()
    return known


_ids: dict[tuple[int, int, int], str] = {}  # the id file (device, inode, ctime) -> its id


def _make_id(path: Path) -> None:
    """Create the id file unless another thread or machine did first, complete from its
    first moment: a reader never finds it created and not yet written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".id.{uuid.uuid4().hex}.tmp")
    atomic.write_text(tmp, uuid.uuid4().hex + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: an exclusive create of the name
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(atomic.read_bytes(tmp))
                handle.flush()
                os.fsync(handle.fileno())
    finally:
        os.unlink(tmp)


def text_hash(text: str) -> str:
    """The hash of a ticket's text that its keys are made of."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def repeats(workspace: Workspace, ticket: str) -> Repeats:
    """The repeats asked for `ticket` (none when its file is missing or unreadable)."""
    try:
        return Repeats.model_validate_json(
            (workspace.root / FOLDER / "repeats" / f"{ticket}.json").read_bytes()
        )
    except (FileNotFoundError, ValidationError):
        return Repeats()


def repeat(workspace: Workspace, ticket: str, by: str, run_id: str) -> Repeat:
    """Record that `by` asked for `ticket`'s writes to be made again (its keys change)."""
    path = workspace.root / FOLDER / "repeats" / f"{ticket}.json"
    with fence.locked(path.with_suffix(".lock")):  # two requeues at once both count
        asked = repeats(workspace, ticket)
        made = Repeat(by=by, at=now_iso(), run_id=run_id)
        asked.asked.append(made)
        atomic.write_text(path, asked.model_dump_json(indent=1))
    return made


@dataclass
class History:
    """What the keys of one agent of a ticket are made of."""

    workspace: str
    ticket: str
    text: str
    repeats: int
    agent: str

    def base(self) -> str:
        """The key base (workers/effects.py)."""
        return f"{self.workspace}|{self.ticket}|{self.text}|{self.repeats}|{self.agent}"

    def labels(self) -> dict[str, object]:
        """What each write of this agent records besides its key."""
        return {
            "ticket": self.ticket,
            "text": self.text,
            "repeats": self.repeats,
            "agent": self.agent,
        }


def history(workspace: Workspace, ticket: str, text: str, agent: str) -> History:
    """The history the calls of `agent` about `ticket` (with this text) belong to."""
    count = len(repeats(workspace, ticket).asked)
    return History(workspace_id(workspace), ticket, text_hash(text), count, agent)


def ledger(workspace: Workspace, run_id: str, made: History, fence: Fence = UNFENCED) -> Ledger:
    """The workspace's ledger as one agent of a run writes to it."""
    return Ledger(workspace.root / FOLDER / "writes", run_id, made.labels(), fence)


def of_tickets(workspace: Workspace, store: RunStore, tickets: list[str]) -> dict[str, list[Write]]:
    """For each of `tickets`, the ledger's writes a new run of it (as `store` claimed it)
    would meet under the same keys: same text, same number of repeats. The ledger is read
    once, however many tickets."""
    scopes = {}
    for ticket in tickets:
        try:
            text = text_hash(store.ticket_path(ticket).read_text(encoding="utf-8"))
        except OSError:
            continue
        scopes[ticket] = (text, len(repeats(workspace, ticket).asked))
    found: dict[str, list[Write]] = {ticket: [] for ticket in tickets}
    if not scopes:
        return found
    for w in writes(workspace.root / FOLDER / "writes"):
        scope = scopes.get(str(w.labels.get("ticket")))
        if scope is not None and (w.labels.get("text"), w.labels.get("repeats")) == scope:
            found[str(w.labels["ticket"])].append(w)
    return found


def fates(workspace: Workspace, store: RunStore, tickets: list[str]) -> list[tuple[str, str]]:
    """Each write the ledger holds for `tickets`, in words, with what a new run would do
    with it."""
    return [
        (f"{ticket} {write.tool} (call {write.call_id}, {write.run_id})", fate(write, False))
        for ticket, held in of_tickets(workspace, store, tickets).items()
        for write in held
    ]


def fate(write: Write, repeat_writes: bool) -> str:
    """What a new run of its ticket would do with `write`, in words."""
    if repeat_writes:
        return "runs again (--repeat-writes: a new key)"
    if write.done:
        return "answered from the ledger (not run again)"
    if write.outcome is not None:
        return "runs again (it failed)"
    if write.idempotent:
        return "runs again with the same key (cut off; its tool is idempotent)"
    return "ends write_unsure (cut off; a person checks whether it happened)"
