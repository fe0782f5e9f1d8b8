"""The life of a ticket file, for cron: claimed by exactly one run, never lost.

    inbox/X ──rename──▶ runs/<run>/claimed/X ──▶ stays there: the run's copy of its ticket
       ▲                      │
       └─────── requeue ──────┤
                              └── not a ticket ──▶ quarantine/<run>/X  +  X.reason

A claim is one `rename` per file, atomic within the workspace's filesystem: when several
runs (embedded or distributed, on one machine or several sharing the volume) claim at
once, each file moves for exactly one of them and the others find it gone. Nothing is ever
copied and then deleted, so a crash leaves each file in exactly one place. Writers must
follow the maildir convention: write the file elsewhere (or as a dotfile) and rename it into
inbox/; files modified in the last `settle_s` seconds are left for the next run too.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.errors import UsageError
from orchestrator.intake import inbox
from orchestrator.intake.ticketfile import shown
from orchestrator.run.records import RejectedFile
from orchestrator.run.store import RunStore


def claim(workspace: Workspace, store: RunStore, names: list[str]) -> list[str]:
    """Move each named inbox file into the run's folder; the names this run got."""
    store.claimed_dir.mkdir(parents=True, exist_ok=True)
    got = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):  # another run claimed it first
            os.rename(workspace.inbox / name, store.claimed_dir / name)
            got.append(name)
    return got


def quarantine(
    workspace: Workspace, store: RunStore, rejections: list[inbox.Rejection], taken: set[str]
) -> list[RejectedFile]:
    """Move claimed files that are not tickets to quarantine/<run>/, each with a reason file
    named apart from every name in `taken` (the run's own files); the files moved.

    run.json lists them all before the first one moves, and each reason is written before
    its file: a crash anywhere in between leaves the rest in claimed/, and doing this again
    (`resume`) finishes it without a file missing from the list or without its reason.
    """
    if not rejections:
        return []
    folder = workspace.quarantine / store.run_id
    folder.mkdir(parents=True, exist_ok=True)
    taken = set(taken)
    moves = []
    with store.update_meta() as meta:
        listed = {r.file for r in meta.rejected}
        for rejection in rejections:
            reason = inbox.reason_name(rejection.name, taken)
            taken.add(reason)
            moves.append((rejection, reason, _rejected_file(workspace, folder, rejection)))
            if moves[-1][2].file not in listed:
                meta.rejected.append(moves[-1][2])
    for rejection, reason, _file in moves:
        inbox.write_reason(folder / reason, rejection, store.run_id)
        os.rename(store.claimed_dir / rejection.name, folder / rejection.name)
    return [file for _rejection, _reason, file in moves]


def _rejected_file(workspace: Workspace, folder: Path, rejection: inbox.Rejection) -> RejectedFile:
    relative = os.path.relpath(folder / rejection.name, workspace.root)
    # A name that is not valid UTF-8 stays as it is on disk and is escaped in the records.
    return RejectedFile(
        name=shown(rejection.name),
        kind=rejection.kind,
        reason=rejection.reason,
        file=shown(relative),
    )


@dataclass(frozen=True)
class Requeued:
    """What `requeue` did with each name: moved back, or why not."""

    moved: list[str] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)  # still claimed: inbox/ has that name
    back: list[str] = field(default_factory=list)  # not claimed any more: in inbox/ already
    gone: list[str] = field(default_factory=list)  # neither claimed nor in inbox/


def requeue(workspace: Workspace, store: RunStore, names: list[str]) -> Requeued:
    """Put claimed files back into inbox/ (a later run claims them again); what happened to
    each. A file whose name is already taken in inbox/ stays where it is (never
    overwritten)."""
    done = Requeued()
    for name in names:
        source, target = store.claimed_dir / name, workspace.inbox / name
        if not os.path.lexists(source):
            (done.back if os.path.lexists(target) else done.gone).append(name)
        elif os.path.lexists(target):
            done.taken.append(name)
        else:
            os.rename(source, target)
            done.moved.append(name)
    return done


def claimed_names(store: RunStore) -> list[str]:
    """The files this run claimed and still holds."""
    folder: Path = store.claimed_dir
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def names_of(store: RunStore, ticket_ids: list[str]) -> list[str]:
    """The claimed file names of `ticket_ids` (all claimed files if none are named);
    `ValueError` naming an id the run does not have."""
    if not ticket_ids:
        return claimed_names(store)
    names = []
    for ticket_id in ticket_ids:
        if store.record_path(ticket_id).exists():
            # The file it came from is on the record itself, routes.json or not.
            names.append(Path(store.record(ticket_id).source).name)
            continue
        # Its record was lost (a damaged run folder): the claimed file named after it.
        same = [n for n in claimed_names(store) if Path(n).stem == ticket_id]
        if not same:
            raise UsageError(f"run {store.run_id} has no ticket {ticket_id!r}")
        names += same
    return names
