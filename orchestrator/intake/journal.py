"""A claim that no crash can hide: the run exists before the first file moves.

    runs/<run>/run.json      written first, as the run would look if the claim never
                             finished: `crashed`, exit 3, its error saying where the files
                             are and which commands bring them back
    runs/.claiming/<run>     the journal: the names the run is about to claim (JSON), from
                             before the first rename until every file it got is a ticket or
                             quarantined and run.json says `running`

A full disk, a read-only volume or a SIGKILL between two renames therefore leaves a run that
`runs`, `status`, `resume` and `requeue` know, and a journal entry that the next `run` finds:
it refuses to start (exit 3) while a claim that no live process holds has files, naming the
run and the commands that fix it. `resume` finishes the claim (submission/start.py), `requeue`
puts the files back; either closes the entry. The journal is one small folder, so the next
`run` looks at it without reading every run of the workspace.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from orchestrator.config.workspace import Workspace
from orchestrator.errors import RunStateError
from orchestrator.exit_codes import ExitCode
from orchestrator.intake import claims
from orchestrator.run import lease
from orchestrator.run.ending import crash_text
from orchestrator.run.records import RunMeta, RunStatus
from orchestrator.run.store import RunStore
from workers import atomic

JOURNAL_DIR = ".claiming"


def entry(store: RunStore) -> Path:
    """The run's journal entry (it exists while the run's claim is open)."""
    return store.dir.parent / JOURNAL_DIR / store.run_id


def is_open(store: RunStore) -> bool:
    """True while the run's claim has not finished."""
    return entry(store).exists()


def open_claim(store: RunStore, meta: RunMeta, names: list[str]) -> None:
    """Record the run as a claim that did not finish, then journal the names it is about to
    claim; the caller holds the run's lease and renames only after this returns."""
    meta.end(RunStatus.CRASHED, ExitCode.CRASHED, unfinished(store.run_id))
    store.write_meta(meta)
    path = entry(store)
    path.parent.mkdir(exist_ok=True)
    # A name that is not UTF-8 keeps its bytes as lone surrogates, which JSON escapes.
    atomic.write_text(path, json.dumps(names))


def names(store: RunStore) -> set[str]:
    """The names the run set out to claim (none if its journal entry is gone)."""
    try:
        return set(json.loads(entry(store).read_bytes()))
    except (OSError, ValueError):
        return set()


def close(store: RunStore) -> None:
    """The claim is finished (or its files were put back): no journal entry any more."""
    with contextlib.suppress(FileNotFoundError):
        entry(store).unlink()
    with contextlib.suppress(OSError):  # not empty: another run's claim is open
        entry(store).parent.rmdir()  # runs/ lists runs only, while no claim is open


def requeued(store: RunStore) -> None:
    """After `requeue`: a claim that did not finish and holds no file any more is closed,
    and the run's record says where its files went."""
    if not is_open(store) or claims.claimed_names(store):
        return
    with store.update_meta() as meta:
        why = "its claim of inbox/ did not finish; `requeue` put its files back in inbox/"
        meta.end(RunStatus.CRASHED, ExitCode.CRASHED, why)
    close(store)


def unfinished(run_id: str, cause: str = "") -> str:
    """The error of a run whose claim did not finish: where its files are, how to go on."""
    why = f" ({cause})" if cause else ""
    return f"its claim of inbox/ did not finish{why}: {_ways_on(run_id)}"


def _ways_on(run_id: str, held: int | None = None) -> str:
    """Where a run's claimed files are (`held` of them, if known), and the two ways on."""
    what = "its files are" if held is None else f"{_files(held)} {'is' if held == 1 else 'are'}"
    return (
        f"{what} in runs/{run_id}/claimed/: `ticketgraph resume {run_id}` finishes the "
        f"claim once fixed, `ticketgraph requeue {run_id}` puts them back in inbox/"
    )


def failed(store: RunStore, exc: BaseException) -> str:
    """Record why the run's claim failed, if the run folder can still be written (a full
    disk may not let it: the first record already says the claim did not finish); the
    sentence the command ends with."""
    cause = crash_text(exc)
    with contextlib.suppress(Exception):  # the first record stands; this only adds the cause
        with store.update_meta() as meta:
            meta.end(RunStatus.CRASHED, ExitCode.CRASHED, unfinished(store.run_id, cause))
        store.tracer(node="inbox").emit("run_crashed", error=cause)
    ways = _ways_on(store.run_id, len(claims.claimed_names(store)))
    return f"run {store.run_id} crashed while claiming inbox/ ({cause}); {ways}"


def _files(count: int) -> str:
    return f"{count} file{'' if count == 1 else 's'}"


def stranded(workspace: Workspace) -> list[RunStore]:
    """Runs whose claim did not finish, that no live process holds, and that hold files."""
    folder = workspace.runs / JOURNAL_DIR
    try:
        run_ids = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    found = []
    for run_id in run_ids:
        try:
            store = RunStore(workspace.runs / run_id)
        except RunStateError:  # not a run's entry (a temp file of one being written)
            continue
        if not store.meta_path.exists() or lease.holder(store) is not None:
            continue  # being claimed right now (or not a run yet)
        if claims.claimed_names(store):
            found.append(store)
    return found


def stranded_message(runs: list[RunStore]) -> str:
    """One sentence: which runs are stranded, and the commands that fix them."""
    first = runs[0].run_id
    held = _files(len(claims.claimed_names(runs[0])))
    others = f" (and {len(runs) - 1} more: `ticketgraph runs`)" if len(runs) > 1 else ""
    return (
        f"run {first} stopped while claiming inbox/ and holds {held} in "
        f"runs/{first}/claimed/{others}: finish it with `ticketgraph resume {first}`, or put "
        f"them back with `ticketgraph requeue {first}`; no new run starts until then"
    )
