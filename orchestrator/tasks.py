"""Thin Celery tasks: take references (a run folder, the submission's attempt id, a ticket id),
call the node, send what the plan says comes next, and return a small summary.

Per-ticket tasks never raise: a failure is recorded on the ticket and its slot is handed on,
so one bad ticket cannot stall its fan-out. Whole-run steps that raise mark the run crashed
and tell the waiting CLI before Celery sees the error.

Every task runs under its soft and hard time limits (limits.py), and rides out a broker
outage (outage.py); one that outlasts the outage window is rejected back to the queue, never
acknowledged as done.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis
from celery import Task
from celery.exceptions import Reject

from orchestrator import dispatch, fence, graph, heartbeat, ids, keys, lease, limits, nodes, outage
from orchestrator.agents import TIME_LIMIT, shared_client
from orchestrator.app import OUTAGE_CONF_KEY, app, worker_llm
from orchestrator.errors import RunStateError, RunStorageError
from orchestrator.exit_codes import ExitCode
from orchestrator.records import RunPhase
from orchestrator.runstate import RunStore
from workers.errors import Superseded

T = TypeVar("T")

log = logging.getLogger(__name__)


def warm_up() -> None:
    """Build what every task needs once, before worker processes are forked from this one.

    The model client costs about 80 ms to build (its SSL context); built here, each forked
    process starts with it instead of paying for it in its first ticket. It holds no
    connection yet, so nothing is shared across the fork.
    """
    shared_client(worker_llm())
    "".encode("idna")  # the first request imports the idna codec


def _ctx(run_dir: str) -> nodes.Context:
    return nodes.Context(store=RunStore(Path(run_dir)), llm=worker_llm())


def _redis() -> redis.Redis:
    return keys.client(app.conf.broker_url)


def _broker(fn: Callable[[], T], what: str) -> T:
    """`fn()` through a broker outage; past the window, the message goes back to the queue
    (or stays unacknowledged, and comes back when the broker does)."""
    try:
        return outage.call(fn, float(app.conf.get(OUTAGE_CONF_KEY) or 0), what)
    except outage.BROKER_ERRORS as exc:
        raise Reject(f"broker unreachable while {what}: {exc}", requeue=True) from exc


def _limited(
    ctx: nodes.Context, what: str, on_hard: Callable[[], None]
) -> contextlib.AbstractContextManager[None]:
    """The task's soft and hard time limits around its node."""
    soft = float(app.conf.task_soft_time_limit or 0)
    hard = float(app.conf.task_time_limit or 0)
    return limits.enforced(ctx.cancel, soft, hard, on_hard, what)


def _crashed(ctx: nodes.Context, exc: BaseException) -> None:
    """Mark the run crashed and tell its CLI, with the error in the event too: if the run
    folder cannot be written (read-only, disk full), the CLI still learns what happened."""
    error = nodes.crash_text(exc)
    try:
        nodes.record_crash(ctx.store, exc)
    except RunStorageError as unrecorded:
        error = str(unrecorded)
        log.error("run %s crashed: %s", ctx.store.run_id, error)
    run_id = ctx.store.run_id
    _broker(lambda: dispatch.publish(_redis(), run_id, "run_end", error=error), "ending a run")


def _whole_run(run_dir: str, node: str, step: Callable[[nodes.Context], T]) -> T:
    """Run a whole-run step as the newest copy of it (fence.py); if it raises, the run is
    marked crashed before Celery sees it. A copy superseded meanwhile raises `Superseded`
    having written nothing after the takeover, and is traced so."""
    ctx = _ctx(run_dir)
    ctx.store = ctx.store.fenced(fence.EpochFence.take(fence.path(ctx.store.dir, f"_{node}")))
    hard = TimeoutError(f"{node}: still running at the hard time limit")
    try:
        with _limited(ctx, node, lambda: _crashed(ctx, hard)):
            return step(ctx)
    except Superseded as exc:
        _superseded(ctx, node, None, exc)
        raise
    except Exception as exc:
        _crashed(ctx, exc)
        raise


def _superseded(ctx: nodes.Context, node: str, ticket_id: str | None, exc: Superseded) -> None:
    """A stale copy steps aside: say so in the trace (and the worker's log)."""
    where = f"{node} {ticket_id}" if ticket_id else node
    log.warning("run %s: %s superseded (%s): this copy stops", ctx.store.run_id, where, exc)
    fields = {"ticket": ticket_id} if ticket_id else {}
    ctx.tracer(node, **fields).emit("superseded", epoch=exc.epoch, newest=exc.newest)


def _per_ticket(
    task: Task, step: graph.FanOut, run_dir: str, attempt: str, ticket_id: str
) -> dict[str, str]:
    """Hold the ticket, run its step (a failure becomes its verdict), hand its slot on."""
    ids.ticket(ticket_id)  # from a message: never made into a path unless a plain name
    ctx, r = _ctx(run_dir), _redis()
    if ctx.meta.status is not RunPhase.RUNNING:
        return {"ticket": ticket_id, "status": f"run {ctx.meta.status.value}"}  # pay nothing
    phase = dispatch.Phase(ctx.store.run_id, attempt, step.phase)
    limit = int(app.conf.task_time_limit or 0) + 60
    delivery = task.request.id or ""
    if not _broker(lambda: dispatch.hold(r, phase, ticket_id, delivery, limit), "holding"):
        return {"ticket": ticket_id, "status": "held elsewhere"}
    node = "fanout" if step is graph.DRAFT else "review"

    def hand_on() -> None:
        what = f"handing on {ticket_id}"
        _broker(lambda: graph.hand_on(r, step, ctx.store, attempt, ticket_id), what)

    try:
        status = _held(ctx, step, node, ticket_id, hand_on)
    except Superseded as exc:  # a newer copy holds the ticket: it hands the slot on
        _superseded(ctx, node, ticket_id, exc)
        return {"ticket": ticket_id, "status": "superseded"}
    except (OSError, RunStateError) as exc:
        # The run's files cannot be written (or are damaged): not this ticket's verdict but
        # the run's crash. The ticket's record still says where it was, so `resume` redoes
        # it once fixed.
        _crashed(ctx, exc)
        return {"ticket": ticket_id, "status": "crashed"}
    return {"ticket": ticket_id, "status": status}


def _held(
    ctx: nodes.Context,
    step: graph.FanOut,
    node: str,
    ticket_id: str,
    hand_on: Callable[[], None],
) -> str:
    """Take the ticket's newest epoch, run the step through it, hand the slot on; a step
    already done (this is a redelivery after its verdict) is only handed on."""
    store = ctx.store
    held = fence.EpochFence.take_if(
        fence.path(store.dir, ticket_id), lambda: store.ticket(ticket_id).status is step.takes
    )
    if held is None:
        hand_on()
        return store.ticket(ticket_id).status.value
    ctx.store = store.fenced(held)
    run = nodes.draft if step is graph.DRAFT else nodes.review

    def out_of_time() -> None:
        error = "still running at the hard time limit; its worker process was replaced"
        nodes.fail_ticket(ctx, ticket_id, node, error, stop=TIME_LIMIT)
        hand_on()

    try:
        with _limited(ctx, f"{step.phase} {ticket_id}", out_of_time):
            status = run(ctx, ticket_id)
    except (OSError, Superseded, RunStateError):
        raise
    except Exception as exc:
        status = nodes.fail_ticket(ctx, ticket_id, node, f"{type(exc).__name__}: {exc}")
    hand_on()
    lease.touch(ctx.store)  # the run makes progress: its lease stays live without its CLI
    return status


def _take_barrier(run_dir: str, attempt: str, after: graph.FanOut) -> None:
    phase = dispatch.Phase(RunStore(Path(run_dir)).run_id, attempt, after.phase)
    _broker(lambda: dispatch.take_barrier(_redis(), phase), "taking a barrier")


@app.task(name="orchestrator.route")
def route(run_dir: str, attempt: str) -> dict[str, int]:
    """Classify every claimed ticket with one model call, then fan the drafts out."""
    return _then_fan_out(run_dir, attempt, "route", nodes.route, graph.DRAFT)


def _then_fan_out(
    run_dir: str,
    attempt: str,
    node: str,
    step: Callable[[nodes.Context], list[str]],
    fan: graph.FanOut,
) -> dict[str, int]:
    """Run a whole-run step that ends in a fan-out (route, merge), unless the run stops
    after it (the step itself records the stop)."""
    ctx = _ctx(run_dir)
    if ctx.meta.status is not RunPhase.RUNNING:  # stopped or timed out while queued
        return {fan.phase: 0}
    try:
        taking = _whole_run(run_dir, node, step)
    except Superseded:  # a newer copy of this step fans out
        return {fan.phase: 0}
    r = _redis()
    _broker(lambda: dispatch.publish(r, ctx.store.run_id, "node_end", node=node), "telling")
    if ctx.store.meta().status is not RunPhase.RUNNING:
        _broker(lambda: dispatch.publish(r, ctx.store.run_id, "run_end"), "ending a run")
        return {fan.phase: 0}
    pool = ctx.meta.config.pool_size
    _broker(lambda: graph.fan_out(r, fan, ctx.store, attempt, taking, pool), "fanning out")
    return {fan.phase: len(taking)}


@app.task(name="orchestrator.draft", bind=True)
def draft(self: Task, run_dir: str, attempt: str, ticket_id: str) -> dict[str, str]:
    """Draft one ticket; a failure becomes that ticket's verdict."""
    return _per_ticket(self, graph.DRAFT, run_dir, attempt, ticket_id)


@app.task(name="orchestrator.merge")
def merge(run_dir: str, attempt: str) -> dict[str, int]:
    """Publish drafts to out/, then fan the reviews out (unless the run stops here)."""
    _take_barrier(run_dir, attempt, graph.DRAFT)
    return _then_fan_out(run_dir, attempt, "merge", nodes.merge, graph.REVIEW)


@app.task(name="orchestrator.review", bind=True)
def review(self: Task, run_dir: str, attempt: str, ticket_id: str) -> dict[str, str]:
    """Gate and rewrite one draft; a failure becomes that ticket's verdict."""
    return _per_ticket(self, graph.REVIEW, run_dir, attempt, ticket_id)


@app.task(name="orchestrator.report")
def report(run_dir: str, attempt: str) -> dict[str, int]:
    """Render the report, record the exit code, and tell the waiting CLI."""
    _take_barrier(run_dir, attempt, graph.REVIEW)
    if _ctx(run_dir).meta.status is RunPhase.STOPPED:  # revoked while queued: pay nothing
        return {"exit_code": ExitCode.STOPPED}
    try:
        code = _whole_run(run_dir, "report", nodes.finish_report)
    except Superseded:  # a newer copy reports
        return {"exit_code": ExitCode.STOPPED}
    run_id = RunStore(Path(run_dir)).run_id
    _broker(lambda: dispatch.publish(_redis(), run_id, "run_end", exit_code=code), "ending a run")
    return {"exit_code": code}


__all__ = ["draft", "heartbeat", "merge", "report", "review", "route"]
