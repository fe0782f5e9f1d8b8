"""Start, execute and resume runs: claim the inbox, submit the plan, wait for the verdict."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from celery import Celery

from orchestrator import (
    claims,
    config,
    dispatch,
    embedded,
    graph,
    inbox,
    keys,
    lease,
    nodes,
    outage,
    report,
)
from orchestrator.app import configure
from orchestrator.errors import (
    BrokerLostRun,
    BrokerUnavailable,
    ConfigError,
    RunStorageError,
    RunTimeout,
)
from orchestrator.exit_codes import ExitCode
from orchestrator.records import (
    FAILED_STOPS,
    RejectedFile,
    RunConfig,
    RunMeta,
    RunPhase,
    TicketRecord,
    TicketStatus,
)
from orchestrator.runstate import ROUTER, RunStore, link_latest, new_run_id
from orchestrator.settings import GraphSettings
from orchestrator.workspace import Workspace
from workers import atomic
from workers.settings import HarnessSettings
from workers.state import RunState
from workers.state import retry as retry_state
from workers.trace import now_iso

# How often the waiting CLI looks at run.json when no event came: a lost event (a Redis
# restart) costs at most this long, and a quiet run costs one small file read per period.
CHECK_EVERY_S = 1.0
# A task message sent this many visibility timeouts ago that no worker took was lost (kombu
# pops a message before recording it as unacknowledged: a worker killed in between loses
# it). The waiting CLI sends such tickets again; a duplicate is absorbed by `hold`.
LOST_AFTER_TIMEOUTS = 2

Event = dict[str, Any]


def start(workspace: Workspace, settings: GraphSettings) -> RunStore | None:
    """Claim what inbox/ holds into a new run and write the run's first records; None if
    there was nothing to claim (no run folder is left behind)."""
    llm = HarnessSettings()
    workspace.check_folders()
    effective = config.load(workspace, settings, llm)
    run_config = config.run_config(workspace, effective, settings, llm)  # before claiming
    limits = inbox.InboxLimits(**effective.inbox.model_dump())
    names = inbox.claimable(workspace.inbox, time.time(), limits)
    if not names:
        return None
    store = RunStore(workspace.runs / new_run_id())
    store.dir.mkdir(parents=True)
    claimed = claims.claim(workspace, store, names)
    if not claimed:  # other runs claimed everything first
        shutil.rmtree(store.dir)
        return None
    tickets, rejected = _sort_claimed(workspace, store, claimed, limits)
    _write_tickets(store, tickets)
    store.write_meta(_meta(workspace, store, run_config, rejected))
    trace = store.tracer(node="inbox")
    for file in rejected:
        trace.emit("rejected", file=file.file, kind=file.kind, reason=file.reason)
    store.materialise()
    workspace.out.mkdir(parents=True, exist_ok=True)
    link_latest(workspace.root, store)
    return store


def _sort_claimed(
    workspace: Workspace, store: RunStore, names: list[str], limits: inbox.InboxLimits
) -> tuple[list[inbox.Ticket], list[RejectedFile]]:
    """Tickets from the claimed files; the rest quarantined with their reasons."""
    seen = [inbox.inspect(store.claimed_dir / name, limits) for name in names]
    tickets, duplicates = inbox.dedupe([t for t in seen if isinstance(t, inbox.Ticket)])
    rejections = [r for r in seen if isinstance(r, inbox.Rejection)] + duplicates
    return tickets, [claims.quarantine(workspace, store, r) for r in rejections]


def _write_tickets(store: RunStore, tickets: list[inbox.Ticket]) -> None:
    """Each ticket's text and first record, in one flush."""
    source = os.path.relpath(store.claimed_dir, store.dir.parent.parent)
    records = {
        t.id: TicketRecord(source=f"{source}/{t.name}", format=t.format, encoding=t.encoding)
        for t in tickets
    }
    atomic.write_many(
        [(store.ticket_path(t.id), t.text + "\n") for t in tickets]
        + [(store.record_path(i), r.model_dump_json()) for i, r in records.items()]
    )


def _meta(
    workspace: Workspace, store: RunStore, run_config: RunConfig, rejected: list[RejectedFile]
) -> RunMeta:
    now = now_iso()
    return RunMeta(
        run_id=store.run_id,
        started_at=now,
        updated_at=now,
        workspace=str(workspace.root.resolve()),
        config=run_config,
        rejected=rejected,
    )


RetryPolicy = Literal["retryable", "all", "none"]


def reopen(store: RunStore, retry: RetryPolicy = "retryable") -> list[str]:
    """Make a stopped, crashed or finished run resumable: failures that may pass on a retry
    (`retry`: those, all, none) go back to the step that failed, keeping what they paid.
    Returns the tickets that will be tried again."""
    again = [] if retry == "none" else _retry_failed(store, force=retry == "all")
    with store.update_meta() as meta:
        if meta.status is not RunPhase.DONE or again:
            meta.end(RunPhase.RUNNING, None)
            meta.config.stop_after = None
    return again


def _retry_failed(store: RunStore, force: bool) -> list[str]:
    """Put failed tickets (and a failed router) back where they failed; their ids."""
    _retry_agents(store, ROUTER, force)
    again: dict[str, TicketStatus] = {}
    for ticket_id, ticket in store.tickets().items():
        if ticket.stop not in FAILED_STOPS or not (ticket.retryable or force):
            continue
        _retry_agents(store, ticket_id, force)
        drafted = store.draft_path(ticket_id).exists()
        again[ticket_id] = TicketStatus.DRAFTED if drafted else TicketStatus.ROUTED
        ticket.status, ticket.stop, ticket.error, ticket.retryable = (
            again[ticket_id],
            None,
            None,
            False,
        )
        store.save_ticket(ticket_id, ticket)
    redo = ("fanout", "merge", "review", "report") if TicketStatus.ROUTED in again.values() else ()
    redo = redo or (("review", "report") if again else ())
    for node in redo:
        store.node_path(node).unlink(missing_ok=True)
    return list(again)


def _retry_agents(store: RunStore, ticket_id: str, force: bool) -> None:
    """Let the ticket's failed agent runs go on from their last paid turn."""
    for path in sorted((store.dir / "agents").glob(f"{ticket_id}.*.json")):
        state = RunState.load(path)
        if retry_state(state, force=force):
            state.save(path)


def execute(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_event: Callable[[Event | None], None] = lambda _event: None,
) -> int:
    """Submit the run's plan and wait for its verdict; return the run's exit code.

    `on_event` sees each event the run publishes (a node ended, the run ended), and None
    after each second without one.
    """
    distributed = bool(settings.broker_url)
    held = lease.acquire(store, "distributed" if distributed else "embedded")
    try:
        return _execute_held(store, settings, llm, on_event, held)
    finally:
        if not distributed or store.meta().status is not RunPhase.RUNNING:
            held.release()  # a distributed run still going on keeps it, touched by its tasks


def _execute_held(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_event: Callable[[Event | None], None],
    held: lease.Lease,
) -> int:
    meta = store.meta()
    if meta.status is RunPhase.DONE and meta.exit_code is not None:
        return meta.exit_code
    distributed = bool(settings.broker_url)
    end: Event | None = None
    try:
        workspace = Workspace(Path(meta.workspace))
        workspace.check_folders()
        check_writable(store.dir, workspace.out)  # before anything is paid for
        if not store.ticket_ids():
            _finish_empty(store)
        else:
            with _celery(workspace, settings, llm, meta.config.pool_size) as app:
                end = _submit_and_wait(app, store, settings, on_event, held)
    except KeyboardInterrupt:
        return _interrupted(store, embedded_run=not distributed)
    except BrokerLostRun as exc:
        return _lost(store, exc)
    except RunTimeout as exc:
        return _timed_out(store, exc)
    except BrokerUnavailable as exc:
        if distributed:
            raise  # the run goes on if its workers reach the broker: not a crash
        return nodes.record_crash(store, exc)  # an embedded run's own Redis died with it
    except Exception as exc:
        return nodes.record_crash(store, exc)
    code = store.meta().exit_code
    if code is None and end is not None and end.get("error"):
        # A task crashed the run but could not record it (the run folder failed it).
        return nodes.record_crash(store, RunStorageError(end["error"]))
    return ExitCode.CRASHED if code is None else code


def check_writable(*folders: Path) -> None:
    """Create and remove a file in each folder; `RunStorageError` naming the first that
    cannot be written (read-only, full, missing, not ours)."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
                pass
        except OSError as exc:
            raise RunStorageError(
                f"{folder} is not writable ({nodes.crash_text(exc)}); fix it, then resume"
            ) from exc


def _interrupted(store: RunStore, embedded_run: bool) -> int:
    """Ctrl-C or SIGTERM while waiting: an embedded run stops; a distributed one goes on."""
    if embedded_run:
        with store.update_meta() as meta:
            meta.end(RunPhase.STOPPED, ExitCode.STOPPED, "interrupted by a signal")
        store.tracer(node="run").emit("run_interrupted")
        store.materialise()
    return ExitCode.STOPPED


def _timed_out(store: RunStore, exc: RunTimeout) -> int:
    """No verdict in time: stop the run (exit 2, resumable). Its tasks still queued see the
    run stopped and do nothing, on any worker, now or after a restart; a step already
    running finishes and is kept, so `resume` does not pay for it again."""
    with store.update_meta() as meta:
        if meta.status is not RunPhase.RUNNING:
            return meta.exit_code if meta.exit_code is not None else ExitCode.CRASHED
        meta.end(RunPhase.STOPPED, ExitCode.STOPPED, str(exc))
    store.tracer(node="run").emit("run_interrupted", reason=str(exc))
    store.materialise()
    return ExitCode.STOPPED


def _lost(store: RunStore, exc: BrokerLostRun) -> int:
    """The broker lost the run's queued work: stop it (resumable), exit 2."""
    with store.update_meta() as meta:
        meta.end(RunPhase.STOPPED, ExitCode.STOPPED, str(exc))
    store.tracer(node="run").emit("run_interrupted", reason=str(exc))
    store.materialise()
    return ExitCode.STOPPED


def _submit_and_wait(
    app: Celery,
    store: RunStore,
    settings: GraphSettings,
    on_event: Callable[[Event | None], None],
    held: lease.Lease,
) -> Event | None:
    """Send the run's first unfinished step, then follow its events until it ends; return
    the run's last event (None if it ended without one).

    Events are a blocking read on a Redis list, so the wait costs nothing while nothing
    happens; run.json (a small file) is checked when no event comes for a while, so a run
    that ended without a word (its event lost) still ends the wait.

    A broker outage is ridden out for `broker_outage_s` (BrokerUnavailable after that); a
    broker that comes back without the submission's marker lost the run (BrokerLostRun).
    """
    r = keys.client(app.conf.broker_url)
    window = _outage_window(settings)
    attempt = secrets.token_hex(3)

    def submit() -> None:
        r.delete(keys.events(store.run_id))  # left over from an earlier submission
        graph.submit(r, store, store.read(), attempt=attempt)

    _through_outage(submit, window, "submitting the run", settings)
    deadline = time.monotonic() + settings.run_timeout_s
    lost_after = LOST_AFTER_TIMEOUTS * settings.visibility_timeout_s
    next_sweep = time.monotonic() + lost_after
    while True:
        held.renew()
        try:
            event = dispatch.next_event(r, store.run_id, CHECK_EVERY_S)
            if time.monotonic() >= next_sweep:
                graph.sweep(r, store, attempt, lost_after)
                next_sweep = time.monotonic() + lost_after / 4
        except outage.BROKER_ERRORS:
            _after_outage(r, store, attempt, window, settings)
            continue
        on_event(event)  # None: a quiet second (progress views read the trace then)
        if event is not None and event["event"] == "run_end":
            return event
        if event is None and store.meta().status is not RunPhase.RUNNING:
            return None
        if time.monotonic() > deadline:
            raise RunTimeout(
                f"no verdict after {settings.run_timeout_s:g} s (--timeout); what it had "
                "queued was revoked"
            )


QUICK_PING_S = 0.5  # a live worker answers a ping in milliseconds; say so only past this


def require_workers(settings: GraphSettings, wait_s: float) -> None:
    """With a shared broker, make sure at least one worker answers (Celery's ping) before
    anything is claimed; `ConfigError` naming the broker (password masked) if none does.
    An embedded run starts its own workers."""
    if not settings.broker_url:
        return
    from kombu.utils.url import maybe_sanitize_url

    app = configure(settings.broker_url, settings, HarnessSettings())
    where = maybe_sanitize_url(settings.broker_url)
    try:
        answers = app.control.ping(timeout=min(QUICK_PING_S, wait_s), limit=1)
        if not answers and wait_s > QUICK_PING_S:
            print(f"waiting up to {wait_s:g} s for a worker on {where}", file=sys.stderr)
            answers = app.control.ping(timeout=wait_s - QUICK_PING_S, limit=1)
    except outage.BROKER_ERRORS as exc:
        raise ConfigError(f"cannot reach the broker at {where}: {exc}") from exc
    if not answers:
        raise ConfigError(
            f"no worker answered on the broker at {where} within {wait_s:g} s: start one "
            "with `ticketgraph worker` (same TICKETGRAPH_BROKER_URL and LLM_BASE_URL), or "
            "wait longer with --wait-for-workers SECONDS"
        )


def _outage_window(settings: GraphSettings) -> float:
    """How long to wait for the broker: an embedded Redis that went away is not coming back."""
    return settings.broker_outage_s if settings.broker_url else embedded.OUTAGE_S


def _through_outage(
    fn: Callable[[], Any], window: float, what: str, settings: GraphSettings
) -> Any:
    try:
        return outage.call(fn, window, what)
    except outage.BROKER_ERRORS as exc:
        where = settings.broker_url or "the embedded Redis"
        raise BrokerUnavailable(
            f"the broker at {where} was unreachable for {window:.0f} s while {what} ({exc})"
        ) from exc


def _after_outage(
    r: Any, store: RunStore, attempt: str, window: float, settings: GraphSettings
) -> None:
    """Wait for the broker to answer again; then make sure it still has the run."""
    alive = _through_outage(
        lambda: dispatch.still_submitted(r, store.run_id, attempt),
        window,
        "waiting for the run's events",
        settings,
    )
    if not alive:
        raise BrokerLostRun("the broker restarted without its data and lost this run's queued work")


@contextlib.contextmanager
def _celery(
    workspace: Workspace, settings: GraphSettings, llm: HarnessSettings, pool_size: int
) -> Iterator[Celery]:
    """A configured app: the given broker, or an embedded Redis with worker processes."""
    if settings.broker_url:
        yield configure(settings.broker_url, settings, llm)
        return
    with embedded.cluster(workspace, settings, llm, pool_size) as app:
        yield app


def _finish_empty(store: RunStore) -> None:
    """A run whose every claimed file was rejected: someone must look (exit 1)."""
    with store.update_meta() as meta:
        meta.end(RunPhase.DONE, ExitCode.NEEDS_HUMAN if meta.rejected else ExitCode.ALL_PASS)
    atomic.write_text(store.report_path, report.render(store.read()))
    store.materialise()
