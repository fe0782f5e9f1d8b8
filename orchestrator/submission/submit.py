"""A run submitted to its workers, and the wait for its verdict: the lease held, the run
folder and out/ checked before anything is paid for, the broker (a shared one, or an
embedded Redis with worker processes), the plan's first unfinished step sent, the run's
events followed through broker outages, and every way the wait can end turned into the
run's exit code."""

from __future__ import annotations

import contextlib
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from orchestrator.broker import embedded, outage
from orchestrator.broker.app import configure
from orchestrator.config.broker_url import shown
from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import Workspace
from orchestrator.coordination import budget, events, keys
from orchestrator.errors import (
    BrokerLostRun,
    BrokerUnavailable,
    ConfigError,
    RunStorageError,
    RunTimeout,
)
from orchestrator.exit_codes import ExitCode
from orchestrator.plan import canvas, tasks
from orchestrator.run import ending, lease
from orchestrator.run.records import RunStatus
from orchestrator.run.store import RunStore
from orchestrator.steps import report
from orchestrator.submission import cancel
from workers.settings import HarnessSettings

# How often the waiting CLI looks at run.json when no event came, and for the submission's
# marker in Redis: a lost event (a Redis restart) or lost keys (FLUSHALL) cost at most about
# this long, and a quiet run one small file read and one EXISTS per period.
CHECK_EVERY_S = 1.0
# A task message sent this many visibility timeouts ago that no worker took was lost (kombu
# pops a message before recording it as unacknowledged: a worker killed in between loses
# it). The waiting CLI sends such tickets again; a duplicate is absorbed by `hold`.
LOST_AFTER_TIMEOUTS = 2
INTERRUPTED = "interrupted by a signal"

Event = dict[str, Any]


def execute(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_event: Callable[[Event | None], None] = lambda _event: None,
) -> int:
    """Submit the run's plan (the one the app's tasks run) and wait for its verdict; return
    the run's exit code.

    `on_event` sees each event the run publishes (a node ended, the run ended), and None
    after each second without one.
    """
    distributed = bool(settings.broker_url)
    held = lease.acquire(store, "distributed" if distributed else "embedded")
    try:
        return _execute_held(store, settings, llm, on_event, held)
    finally:
        if not distributed or store.meta().status is not RunStatus.RUNNING:
            held.release()  # a distributed run still going on keeps it, touched by its tasks


def _execute_held(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_event: Callable[[Event | None], None],
    held: lease.Lease,
) -> int:
    meta = store.meta()
    if meta.status is RunStatus.DONE and meta.exit_code is not None:
        return meta.exit_code
    distributed = bool(settings.broker_url)
    end: Event | None = None
    try:
        workspace = Workspace(Path(meta.workspace))
        workspace.check_folders()
        check_writable(store.dir, workspace.out)  # before anything is paid for
        if not store.ticket_ids():
            return _finish_empty(store)
        with _celery(workspace, settings, llm, meta.config.pool_size, store) as app:
            end = _submit_and_wait(app, store, settings, on_event, held)
    except KeyboardInterrupt:
        # An embedded run stops with its command (a verdict already written stands: Ctrl-C
        # while its end is materialised); a distributed one goes on in its workers.
        if distributed:
            return ExitCode.STOPPED
        return ending.stopped(store, INTERRUPTED, if_running=True)
    except BrokerLostRun as exc:  # the broker lost the run's queued work: resumable
        return ending.stopped(store, str(exc), if_running=True)
    except RunTimeout as exc:
        # Its tasks still queued see the run stopped and do nothing, on any worker, now or
        # after a restart; a step already running finishes and is kept (resume keeps it).
        return ending.stopped(store, str(exc), if_running=True)
    except BrokerUnavailable as exc:
        if distributed:
            raise  # the run goes on if its workers reach the broker: not a crash
        return ending.crashed(store, exc)  # an embedded run's own Redis died with it
    except Exception as exc:
        # A failure after the run ended (tearing its embedded workers down, say) is said,
        # and the verdict the run recorded stands; a running run ends crashed.
        if store.meta().status is not RunStatus.RUNNING:
            print(
                f"ticketgraph: after run {store.run_id} ended: {ending.crash_text(exc)}",
                file=sys.stderr,
            )
        return ending.crashed(store, exc, if_running=True)
    code = store.meta().exit_code
    if code is None and end is not None and end.get("error"):
        # A task crashed the run but could not record it (the run folder failed it).
        return ending.crashed(store, RunStorageError(end["error"]))
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
                f"{folder} is not writable ({ending.crash_text(exc)}); fix it, then resume"
            ) from exc


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
    that ended without a word (its event lost) still ends the wait: once its end has
    materialised run-state.json too, or a visibility timeout after (its worker died: the
    redelivered copy finds the run ended and does nothing more).

    A broker outage is ridden out for `broker_outage_s` (BrokerUnavailable after that); a
    broker that comes back without the submission's marker lost the run (BrokerLostRun),
    and so did one whose marker went without an outage (FLUSHALL, eviction, a failover):
    it is looked for every CHECK_EVERY_S.
    """
    r = keys.client(app.conf.broker_url)
    window = _outage_window(settings)
    attempt = secrets.token_hex(3)

    def submit() -> None:
        r.delete(keys.events(store.run_id))  # left over from an earlier submission
        budget.open_ledger(r, store, budget.limits(store.meta().config))
        canvas.submit(r, tasks.registered(), store, attempt)

    _through_outage(submit, window, "submitting the run", settings)
    relay = cancel.Relay(store, r)  # cancels made where no broker was at hand
    deadline = time.monotonic() + settings.run_timeout_s
    lost_after = LOST_AFTER_TIMEOUTS * settings.visibility_timeout_s
    next_sweep = time.monotonic() + lost_after
    next_look = time.monotonic() + CHECK_EVERY_S
    ended_at: float | None = None  # when a quiet second first found the run ended
    while True:
        held.renew()
        try:
            event = events.next_event(r, store.run_id, CHECK_EVERY_S)
            if time.monotonic() >= next_look:  # FLUSHALL, eviction: no error says so
                _still_there(r, store, attempt)
                next_look = time.monotonic() + CHECK_EVERY_S
            if time.monotonic() >= next_sweep:
                canvas.sweep(r, tasks.registered(), store, attempt, lost_after)
                next_sweep = time.monotonic() + lost_after / 4
        except outage.BROKER_ERRORS:
            _after_outage(r, store, attempt, window, settings)
            continue
        on_event(event)  # None: a quiet second (progress views read the trace then)
        relay.deliver()
        if event is not None and event["event"] == "run_end":
            budget.snapshot(r, store)
            return event
        if event is None:
            status = store.meta().status
            ended_at = None if status is RunStatus.RUNNING else ended_at or time.monotonic()
            if ended_at is not None and (
                _end_written(store, status)
                or time.monotonic() - ended_at >= settings.visibility_timeout_s
            ):
                budget.snapshot(r, store)
                return None
        if time.monotonic() > deadline:
            raise RunTimeout(
                f"no verdict after {settings.run_timeout_s:g} s (--timeout); what it had "
                "queued was revoked"
            )


QUICK_PING_S = 0.5  # a live worker answers a ping in milliseconds; say so only past this
PING_AGAIN_S = 1.0  # while waiting for a worker, how long each ping listens for answers


def require_workers(settings: GraphSettings, wait_s: float) -> None:
    """With a shared broker, make sure at least one worker answers (Celery's ping) before
    anything is claimed; `ConfigError` naming the broker (password masked) if none does.
    An embedded run starts its own workers."""
    if not settings.broker_url:
        return
    app = configure(settings.broker_url, settings, HarnessSettings())
    where = shown(settings.broker_url)
    deadline = time.monotonic() + wait_s
    try:
        answers = app.control.ping(timeout=min(QUICK_PING_S, wait_s), limit=1)
        if not answers and wait_s > QUICK_PING_S:
            print(f"waiting up to {wait_s:g} s for a worker on {where}", file=sys.stderr)
        # A ping reaches only the workers listening when it is sent (a broadcast), so one
        # that starts, or reconnects after a broker restart, during the wait is found by
        # the next one: ask again every second until the wait is over.
        while not answers and (left := deadline - time.monotonic()) > 0:
            answers = app.control.ping(timeout=min(PING_AGAIN_S, left), limit=1)
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


def _end_written(store: RunStore, status: RunStatus) -> bool:
    """Whether an ended run's end has written all it writes. A verdict is written to run.json
    before run-state.json is materialised from every record (run/ending.py), and its
    `run_end` event comes after both: a CLI that took a quiet second then for the end would
    materialise the records again itself (~0.7 s at 1,000 tickets, alongside the worker's).
    A stop or a crash is counted again by the CLI whatever it finds (console.ended_record).
    """
    return status is not RunStatus.DONE or store.materialised_since_meta()


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
    _through_outage(
        lambda: _still_there(r, store, attempt, RESTARTED_EMPTY),
        window,
        "waiting for the run's events",
        settings,
    )


RESTARTED_EMPTY = "the broker restarted without its data and lost this run's queued work"
KEYS_GONE = (
    "the broker lost this run's queued work (its keys are gone: flushed, evicted, or a "
    "failover to a server without them)"
)


def _still_there(r: Any, store: RunStore, attempt: str, why: str = KEYS_GONE) -> None:
    """`BrokerLostRun` (`why`) if the broker no longer has this submission of a run that
    is still running: nothing its workers do now reaches a verdict, and without this look
    (no connection error says so) the wait would last until --timeout."""
    if events.still_submitted(r, store.run_id, attempt):
        return
    if store.meta().status is not RunStatus.RUNNING:
        return  # it ended meanwhile (its end event went with the data): the wait sees that
    raise BrokerLostRun(why)


@contextlib.contextmanager
def _celery(
    workspace: Workspace,
    settings: GraphSettings,
    llm: HarnessSettings,
    pool_size: int,
    store: RunStore,
) -> Iterator[Celery]:
    """A configured app: the given broker, or an embedded Redis with worker processes
    (logging into the run's folder)."""
    if settings.broker_url:
        yield configure(settings.broker_url, settings, llm)
        return
    with embedded.cluster(workspace, settings, llm, pool_size, store.workers_log) as app:
        yield app


def _finish_empty(store: RunStore) -> int:
    """A run whose every claimed file was rejected: someone must look (exit 1)."""
    store.write(store.report_path, report.render(store.read()))
    code = report.exit_code(0, bool(store.meta().rejected))
    return ending.end(store, RunStatus.DONE, code)
