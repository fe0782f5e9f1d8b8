"""Every person's verdict on a reply, kept as a label: the workspace's labels/labels.jsonl,
one JSON object a line, appended under a lock. It lives beside runs/, not in it, so a
clean-up of old runs keeps it; each label holds what `gate replay` needs (the draft, the
ticket's text and the facts it could draw on), so no run folder is read again.

    {"run", "ticket", "category", "draft", "draft_sha256",
     "gate": {"verdict", "rounds": [{"round", "passed", "reports": [...]}]},
     "verdict": "sent" | "edited" | "closed" | "audit_good" | "audit_bad",
     "final", "by", "at", "reason",
     "ticket_text", "facts", "final_sha256"}

docs/people.md describes each key; `ticketgraph labels export` writes them as a dataset.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ValidationError

from orchestrator.config.workspace import Workspace
from orchestrator.errors import RunStorageError
from orchestrator.run.verdicts import Verdict

FOLDER = "labels"
FILE = "labels.jsonl"
LOCK = ".lock"

# What a person let go out as the machine wrote it, and what they would not.
ACCEPTED: frozenset[str] = frozenset({"sent", "audit_good"})
REJECTED: frozenset[str] = frozenset({"edited", "closed", "audit_bad"})


class GateRoundLabel(BaseModel):
    """The gate's verdict on one round."""

    round: int
    passed: bool
    reports: list[str] = []


class GateLabel(BaseModel):
    """What the machine said of the reply: the ticket's verdict, and the gate each round."""

    verdict: str  # the ticket's status as the run ended: pass, needs_human
    rounds: list[GateRoundLabel] = []


class Label(BaseModel):
    """One person's verdict on one run's reply to one ticket."""

    run: str
    ticket: str
    category: str | None
    draft: str
    draft_sha256: str
    gate: GateLabel
    verdict: Verdict
    final: str | None
    by: str
    at: str
    reason: str | None = None
    # Beyond the dataset's keys: what replaying the gate needs without the run folder.
    ticket_text: str = ""
    facts: list[str] = []
    final_sha256: str | None = None


def path(workspace: Workspace) -> Path:
    """The workspace's label store."""
    return workspace.root / FOLDER / FILE


def append(workspace: Workspace, label: Label) -> None:
    """Add one label, durably, under the store's lock (several people may label at once)."""
    folder = workspace.root / FOLDER
    line = label.model_dump_json() + "\n"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / LOCK).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with path(workspace).open("a", encoding="utf-8") as store:
                store.write(line)
                store.flush()
                os.fsync(store.fileno())
    except OSError as exc:
        raise RunStorageError(f"cannot append a label to {path(workspace)}: {exc}") from exc


def read(workspace: Workspace) -> Iterator[Label]:
    """Every label of the workspace, oldest first; a line that is not a label is skipped
    (a torn last line after a crash mid-append)."""
    try:
        handle = path(workspace).open(encoding="utf-8")
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                yield Label.model_validate_json(line)
            except ValidationError:
                continue


def export(workspace: Workspace) -> str:
    """Every label as JSONL: the dataset `ticketgraph eval` reads."""
    return "".join(label.model_dump_json() + "\n" for label in read(workspace))
