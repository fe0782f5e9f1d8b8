"""Start, execute and resume runs: claim the inbox, submit the plan, wait for the verdict."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from orchestrator import dispatch, embedded, graph, inbox, keys, nodes
from orchestrator.app import configure
from orchestrator.errors import RunTimeout
from orchestrator.exit_codes import ExitCode
from orchestrator.records import RunConfig, RunMeta, RunPhase, TicketRecord
from orchestrator.runstate import RunStore, link_latest, new_run_id
from orchestrator.settings import GraphSettings
from orchestrator.workspace import Workspace
from workers import atomic
from workers.settings import HarnessSettings
from workers.trace import now_iso

# How often the waiting CLI looks at run.json when no event came: a lost event (a Redis
# restart) costs at most this long, and a quiet run costs one small file read per period.
CHECK_EVERY_S = 1.0

Event = dict[str, Any]


def start(workspace: Workspace, settings: GraphSettings) -> RunStore:
    """Claim every inbox ticket into a new run folder and write the run's first records."""
    config = workspace.config()
    tickets = inbox.load(workspace.inbox)
    store = RunStore(workspace.runs / new_run_id())
    store.dir.mkdir(parents=True)
    atomic.write_many(
        [(store.ticket_path(t.id), t.text + "\n") for t in tickets]
        + [
            (store.record_path(t.id), TicketRecord(source=t.source).model_dump_json())
            for t in tickets
        ]
    )
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
    store.write_meta(
        RunMeta(
            run_id=store.run_id,
            started_at=now,
            updated_at=now,
            workspace=str(workspace.root.resolve()),
            config=run_config,
        )
    )
    store.materialise()
    workspace.out.mkdir(parents=True, exist_ok=True)
    link_latest(workspace.root, store)
    return store


def reopen(store: RunStore) -> RunMeta:
    """Make a stopped or crashed run resumable: it will finish review and report."""
    with store.update_meta() as meta:
        if meta.status is not RunPhase.DONE:
            meta.end(RunPhase.RUNNING, None)
            meta.config.stop_after = None
    return meta


def execute(
    store: RunStore,
    settings: GraphSettings,
    llm: HarnessSettings,
    on_event: Callable[[Event], None] = lambda _event: None,
) -> int:
    """Submit the run's plan and wait for its verdict; return the run's exit code.

    `on_event` sees each event the run publishes (a node ended, the run ended).
    """
    meta = store.meta()
    if meta.status is RunPhase.DONE and meta.exit_code is not None:
        return meta.exit_code
    try:
        if not store.ticket_ids():
            _finish_empty(store)
        else:
            workspace = Workspace(Path(meta.workspace))
            with _celery(workspace, settings, llm, meta.config.pool_size) as app:
                _submit_and_wait(app, store, settings.run_timeout_s, on_event)
    except KeyboardInterrupt:
        return _interrupted(store, embedded_run=not settings.broker_url)
    except Exception as exc:
        return nodes.record_crash(store, exc)
    code = store.meta().exit_code
    return ExitCode.CRASHED if code is None else code


def _interrupted(store: RunStore, embedded_run: bool) -> int:
    """Ctrl-C or SIGTERM while waiting: an embedded run stops; a distributed one goes on."""
    if embedded_run:
        with store.update_meta() as meta:
            meta.end(RunPhase.STOPPED, ExitCode.STOPPED, "interrupted by a signal")
        store.tracer(node="run").emit("run_interrupted")
        store.materialise()
    return ExitCode.STOPPED


def _submit_and_wait(
    app: Celery, store: RunStore, timeout: float, on_event: Callable[[Event], None]
) -> None:
    """Send the run's first unfinished step, then follow its events until it ends.

    Events are a blocking read on a Redis list, so the wait costs nothing while nothing
    happens; run.json (a small file) is checked when no event comes for a while, so a run
    that ended without a word (its event lost) still ends the wait.
    """
    r = keys.client(app.conf.broker_url)
    r.delete(keys.events(store.run_id))  # left over from an earlier submission of this run
    graph.submit(r, store, store.read(), attempt=secrets.token_hex(3))
    deadline = time.monotonic() + timeout
    while True:
        event = dispatch.next_event(r, store.run_id, CHECK_EVERY_S)
        if event is not None:
            on_event(event)
            if event["event"] == "run_end":
                return
        elif store.meta().status is not RunPhase.RUNNING:
            return
        if time.monotonic() > deadline:
            raise RunTimeout(f"no verdict after {timeout:.0f} s; the run goes on in the workers")


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
    with store.update_meta() as meta:
        meta.end(RunPhase.DONE, ExitCode.ALL_PASS)
    store.materialise()
