"""A run's cancel, kept in its folder, so it holds on every worker, now and after every worker
restarted (Celery's `revoke` lives in each worker's memory):

    runs/<run>/cancel/run.json          the whole run was cancelled: by whom, when, why
    runs/<run>/cancel/<ticket>.json     one ticket was

Every task looks here before it starts its step, and every model request of a step looks
again just before it is sent (`Watch`, the step's cancel token): so once `ticketgraph
cancel` has written the file, no new request of the run starts anywhere. Requests and tools
already running are stopped by the live message (coordination/control.py). `resume` clears the
folder: the run goes on from where the cancel stopped it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from orchestrator.run.records import Cancel
from orchestrator.run.store import RunStore
from workers.cancel import CancelToken
from workers.trace import now_iso

FOLDER = "cancel"
WHOLE_RUN = "run"


def _path(run_dir: Path, ticket: str | None) -> Path:
    return run_dir / FOLDER / f"{ticket or WHOLE_RUN}.json"


def record(store: RunStore, ticket: str | None, by: str, reason: str) -> Cancel:
    """Cancel the run (`ticket` None) or one ticket; an earlier cancel of it stands."""
    earlier = of(store.dir, ticket, whole_run=False)
    if earlier is not None:
        return earlier
    made = Cancel(run_id=store.run_id, ticket=ticket, by=by, at=now_iso(), reason=reason)
    path = _path(store.dir, ticket)
    path.parent.mkdir(exist_ok=True)
    store.write(path, made.model_dump_json())
    return made


def of(run_dir: Path, ticket: str | None = None, whole_run: bool = True) -> Cancel | None:
    """The cancel that stops `ticket` (the whole run's, else its own), if any. One stat of
    the folder when nothing was cancelled (`record` makes it before it writes a cancel)."""
    if not os.path.isdir(run_dir / FOLDER):
        return None
    for name in ([None] if whole_run or ticket is None else []) + ([ticket] if ticket else []):
        try:
            return Cancel.model_validate_json(_path(run_dir, name).read_bytes())
        except FileNotFoundError:
            continue
    return None


def all_of(run_dir: Path) -> list[Cancel]:
    """Every cancel the run has (the whole run's first)."""
    folder = run_dir / FOLDER
    if not folder.is_dir():
        return []
    found = [Cancel.model_validate_json(p.read_bytes()) for p in sorted(folder.glob("*.json"))]
    return sorted(found, key=lambda c: (c.ticket is not None, c.at))


def clear(store: RunStore) -> list[Cancel]:
    """Forget the run's cancels (`resume` takes it up again); what they were."""
    cleared = all_of(store.dir)
    shutil.rmtree(store.dir / FOLDER, ignore_errors=True)
    return cleared


class Watch(CancelToken):
    """A step's cancel token that also looks at the run folder whenever it is checked (the
    harness checks it before each model request): a cancel recorded there sets it."""

    def __init__(self, run_dir: Path, ticket: str | None = None) -> None:
        super().__init__()
        self.run_dir, self.ticket = run_dir, ticket
        # Checked before every model request and tool: one stat of a string path (the folder
        # `record` makes before it writes) when nothing was cancelled, no Path built per check.
        self._folder = str(run_dir / FOLDER)

    def check(self) -> None:
        """Raise `Cancelled` if the token is set or the run (or its ticket) was cancelled."""
        if (
            not self.cancelled
            and os.path.isdir(self._folder)
            and (found := of(self.run_dir, self.ticket)) is not None
        ):
            self.cancel(found.why)
        super().check()
