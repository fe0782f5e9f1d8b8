"""Start, execute and resume runs: claim the inbox, submit the canvas, wait for the verdict."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from celery import Celery

from orchestrator import embedded, graph, inbox
from orchestrator.app import configure
from orchestrator.errors import RunTimeout
from orchestrator.exit_codes import ExitCode
from orchestrator.runstate import (
    RunConfig,
    RunPhase,
    RunRecord,
    RunStore,
    TicketRecord,
    link_latest,
    new_run_id,
    record_crash,
)
from orchestrator.settings import GraphSettings
from orchestrator.workspace import Workspace
from workers.settings import HarnessSettings
from workers.trace import now_iso

POLL_S = 0.02
FULL_READ_EVERY = 25  # polls: at most 0.5 s late if a change went unseen


def start(workspace: Workspace, settings: GraphSettings) -> RunStore:
    """Claim every inbox ticket into a new run folder and write the run's first state."""
    config = workspace.config()
    tickets = inbox.load(workspace.inbox)
    run_id = new_run_id()
    store = RunStore(workspace.runs / run_id)
    (store.dir / "tickets").mkdir(parents=True)
    for ticket in tickets:
        store.ticket_path(ticket.id).write_text(ticket.text + "\n", encoding="utf-8")
    run_config = RunConfig(
        categories=config.graph.categories,
        pool_size=settings.pool_size or config.graph.pool_size,
        max_rounds=config.gate.max_rounds,
        filler_phrases=config.gate.filler_phrases,
        model=config.harness.model,
        max_turns=config.harness.max_turns,
        budget_usd=config.harness.budget_usd,
        stop_after=settings.stop_after,
    )
    now = now_iso()
    store.write(
        RunRecord(
            run_id=run_id,
            started_at=now,
            updated_at=now,
            workspace=str(workspace.root.resolve()),
            config=run_config,
            tickets={t.id: TicketRecord(source=t.source) for t in tickets},
        )
    )
    (workspace.out).mkdir(parents=True, exist_ok=True)
    link_latest(workspace.root, store)
    return store


def reopen(store: RunStore) -> RunRecord:
    """Make a stopped or crashed run resumable: it will finish review and report."""
    with store.update() as record:
        if record.status is not RunPhase.DONE:
            record.end(RunPhase.RUNNING, None)
            record.config.stop_after = None
    return record


def execute(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_update: Callable[[RunRecord], None] = lambda _record: None,
) -> int:
    """Submit the run's canvas and wait for its verdict; return the run's exit code.

    `on_update` sees the run record each time it changes while the run goes on.
    """
    record = store.read()
    if record.status is RunPhase.DONE and record.exit_code is not None:
        return record.exit_code
    try:
        if not record.tickets:
            _finish_empty(store)
        else:
            with _celery(Workspace(Path(record.workspace)), settings, llm, record.config.pool_size):
                _submit_and_wait(store, record, settings.run_timeout_s, on_update)
    except KeyboardInterrupt:
        return _interrupted(store, embedded_run=not settings.broker_url)
    except Exception as exc:
        return record_crash(store, exc)
    code = store.read().exit_code
    return ExitCode.CRASHED if code is None else code


def _interrupted(store: RunStore, embedded_run: bool) -> int:
    """Ctrl-C or SIGTERM while waiting: an embedded run stops; a distributed one goes on."""
    if embedded_run:
        with store.update() as record:
            record.end(RunPhase.STOPPED, ExitCode.STOPPED, "interrupted by a signal")
        store.tracer(node="run").emit("run_interrupted")
    return ExitCode.STOPPED


def _submit_and_wait(
    store: RunStore, record: RunRecord, timeout: float, on_update: Callable[[RunRecord], None]
) -> None:
    """Send the canvas, then watch the run record until the run leaves `running`.

    Tasks record their own crashes in the record, so a failed step ends the wait at once;
    the Celery result only adds errors raised before any task ran.
    """
    canvas = graph.plan(
        str(store.dir), list(record.tickets), record.config.pool_size, record.config.stop_after
    )
    seen, record = store.version(), store.read()  # before submitting: no write is missed
    result = canvas.apply_async()
    deadline = time.monotonic() + timeout
    polls = 0
    while record.status is RunPhase.RUNNING:
        # Parse the record only when a writer replaced it: in an embedded run this loop shares
        # the GIL with the worker threads, and a big record takes milliseconds to validate. A
        # reused inode within one mtime tick could hide a write, so read anyway now and then.
        polls += 1
        if (version := store.version()) != seen or polls % FULL_READ_EVERY == 0:
            seen, record = version, store.read()
            on_update(record)
            continue
        if result.failed():
            result.maybe_throw()
        if time.monotonic() > deadline:
            raise RunTimeout(f"no verdict after {timeout:.0f} s; the run goes on in the workers")
        time.sleep(POLL_S)


@contextlib.contextmanager
def _celery(
    workspace: Workspace, settings: GraphSettings, llm: HarnessSettings, pool_size: int
) -> Iterator[Celery]:
    """A configured app: the given broker, or an embedded Redis with an in-process worker."""
    if settings.broker_url:
        yield configure(settings.broker_url, settings, llm)
        return
    with embedded.redis() as url, embedded.model_endpoint(workspace, llm) as live:
        configured = configure(url, settings, live)
        with embedded.worker(configured, pool_size):
            yield configured


def _finish_empty(store: RunStore) -> None:
    with store.update() as record:
        record.end(RunPhase.DONE, ExitCode.ALL_PASS)
