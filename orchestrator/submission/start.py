"""A new run from what inbox/ holds: every setting and the model endpoint checked, the run
recorded and its claim journaled (journal.py), the settled files claimed (one atomic rename
each), each sorted into a ticket or quarantine, and the run's first records written."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime

from orchestrator.config import declarations, endpoint, layers
from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import Workspace
from orchestrator.errors import ClaimStranded, RunStorageError, UsageError
from orchestrator.intake import claims, inbox, journal
from orchestrator.plan.steps import Plan
from orchestrator.run import lease
from orchestrator.run.ending import crash_text
from orchestrator.run.records import RunConfig, RunMeta, TicketRecord
from orchestrator.run.store import RunStore, link_latest, new_run_id
from workers.settings import HarnessSettings
from workers.trace import now_iso


def start(workspace: Workspace, settings: GraphSettings, plan: Plan) -> RunStore | None:
    """Claim what inbox/ holds into a new run of `plan` and write the run's first records;
    None if there was nothing to claim (no run folder is left behind). Every setting and the
    model endpoint are checked, and an earlier run's unfinished claim refuses, before
    anything is claimed."""
    llm = HarnessSettings()
    if not workspace.inbox.is_dir():
        raise UsageError(
            f"no inbox folder at {workspace.inbox}: is {workspace.root} a workspace? "
            f"(`ticketgraph init {workspace.root}` makes one)"
        )
    workspace.check_folders()
    effective = layers.load(workspace, settings, llm)
    run_config = layers.run_config(workspace, effective, settings, llm)
    run_config.nodes = plan.reported_nodes
    # The tools and checks it declares, imported now: one that cannot be is exit 78 here.
    run_config.fingerprint = declarations.load(workspace, run_config).fingerprint
    endpoint.require(workspace, settings, llm)
    if stuck := journal.stranded(workspace):
        raise ClaimStranded(journal.stranded_message(stuck))
    limits = inbox.InboxRules(**effective.inbox.model_dump())
    names = inbox.claimable(workspace.inbox, time.time(), limits)
    if not names:
        return None
    store = _opened(workspace, run_config, names)
    try:
        if not claims.claim(workspace, store, names):  # other runs claimed everything first
            _discard(store)
            return None
        finish(workspace, store, limits)
    except Exception as exc:
        raise ClaimStranded(journal.failed(store, exc)) from exc
    return store


def finish_claim(workspace: Workspace, store: RunStore) -> bool:
    """Finish the run's claim if it did not finish (journal.py), as `start` would have;
    True if there was one to finish. `ClaimStranded` if it fails again."""
    if not journal.is_open(store):
        return False
    try:
        finish(workspace, store, inbox.InboxRules(**workspace.config().inbox.model_dump()))
    except Exception as exc:
        raise ClaimStranded(journal.failed(store, exc)) from exc
    return True


def finish(workspace: Workspace, store: RunStore, limits: inbox.InboxRules) -> None:
    """Make the run's claimed files its tickets (texts and first records) and quarantine
    the rest; then the run is `running` and its claim closed. Each step can be done again
    over what an earlier attempt left (a crash anywhere in it): `resume` does."""
    names = claims.claimed_names(store)
    tickets, rejections = _sort_claimed(store, names, limits)
    _write_tickets(store, tickets)
    taken = journal.names(store) | set(names)  # every name the run's files may have
    rejected = claims.quarantine(workspace, store, rejections, taken)
    with store.update_meta() as meta:
        meta.reopen()
    trace = store.tracer(node="inbox")
    for file in rejected:
        trace.emit("rejected", file=file.file, kind=file.kind, reason=file.reason)
    store.materialise(_first_records(store, tickets))
    workspace.out.mkdir(parents=True, exist_ok=True)
    link_latest(workspace.root, store)
    journal.close(store)


def _opened(workspace: Workspace, run_config: RunConfig, names: list[str]) -> RunStore:
    """A new run's folder, held by this process and recorded as a claim that did not
    finish (journal.py), before any file moves; `RunStorageError` if it cannot be written
    (then nothing was claimed, and no folder is left)."""
    store = RunStore(workspace.runs / new_run_id())
    try:
        store.dir.mkdir(parents=True)
        # Held as its process: only it claims, so the claim is free the moment it dies.
        lease.acquire(store, "embedded")
        journal.open_claim(store, _meta(workspace, store, run_config), names)
    except OSError as exc:
        _discard(store)
        raise RunStorageError(
            f"cannot start a run ({crash_text(exc)}); nothing was claimed from inbox/"
        ) from exc
    return store


def _discard(store: RunStore) -> None:
    """A run that claimed nothing leaves nothing."""
    journal.close(store)
    shutil.rmtree(store.dir, ignore_errors=True)


def nothing_to_claim(workspace: Workspace) -> str:
    """Why a run found nothing to claim, in one line: an empty inbox/, or files that wait
    out `[inbox] settle_s` (just copied in), and from when they can be claimed."""
    rules = inbox.InboxRules(**workspace.config().inbox.model_dump())
    count, ready = inbox.unsettled(workspace.inbox, time.time(), rules)
    if not count or ready is None:
        return "inbox/ has nothing to claim: no run started"
    files = f"{count} file{'' if count == 1 else 's'}"
    at = datetime.fromtimestamp(ready).strftime("%H:%M:%S")
    return (
        f"inbox/ has nothing to claim yet: {files} changed less than {rules.settle_s:g} s ago "
        f"(may still be being written; [inbox] settle_s), claimable from {at}: no run started"
    )


def _sort_claimed(
    store: RunStore, names: list[str], limits: inbox.InboxRules
) -> tuple[list[inbox.Ticket], list[inbox.Rejection]]:
    """The tickets among the claimed files, and the rest with their reasons."""
    seen = [inbox.inspect(store.claimed_dir / name, limits) for name in names]
    tickets, duplicates = inbox.dedupe([t for t in seen if isinstance(t, inbox.Ticket)])
    return tickets, [r for r in seen if isinstance(r, inbox.Rejection)] + duplicates


def _write_tickets(store: RunStore, tickets: list[inbox.Ticket]) -> None:
    """Each ticket's text and first record, in one flush."""
    texts = ((store.ticket_path(t.id), t.text + "\n") for t in tickets)
    records = (
        (store.record_path(i), r.model_dump_json()) for i, r in _first_records(store, tickets)
    )
    store.write_many(itertools.chain(texts, records))


def _first_records(
    store: RunStore, tickets: list[inbox.Ticket]
) -> Iterator[tuple[str, TicketRecord]]:
    """Each ticket's first record, made as it is needed (a record is 5.9 KB of objects:
    10,000 held at once were most of the CLI's peak)."""
    source = os.path.relpath(store.claimed_dir, store.workspace.root)
    for t in tickets:
        record = TicketRecord(
            source=f"{source}/{t.name}",
            format=t.format,
            encoding=t.encoding,
            subject=t.subject,
            sender=t.sender,
        )
        yield t.id, record


def _meta(workspace: Workspace, store: RunStore, run_config: RunConfig) -> RunMeta:
    now = now_iso()
    return RunMeta(
        run_id=store.run_id,
        started_at=now,
        updated_at=now,
        workspace=str(workspace.root.resolve()),
        config=run_config,
    )
