"""The Celery tasks: one per step of the plan, made from its table by `register` (the one way
tasks are registered), and `orchestrator.fan_out`, which starts a per-ticket step that
follows another. Every worker imports this module (the app's `include`).

A task is thin: it takes references (a run folder, the submission's attempt id, a ticket
id), takes its fence (run/fence.py: a copy superseded by a newer delivery writes nothing),
calls the step's function, sends what the plan says comes next (plan/canvas.py), and
returns a small summary.

Per-ticket tasks never raise: a failure is recorded on the ticket and its slot is handed on,
so one bad ticket cannot stall its fan-out. Whole-run steps that raise mark the run crashed
and tell the waiting CLI before Celery sees the error. Every task runs under its soft and
hard time limits (broker/timelimits.py) and rides out a broker outage (broker/outage.py);
one that outlasts the outage window is rejected back to the queue, never acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Task
from celery.exceptions import Reject

from orchestrator.broker import outage, timelimits
from orchestrator.broker.app import OUTAGE_CONF_KEY, app, worker_llm
from orchestrator.config import declarations
from orchestrator.config.workspace import Workspace
from orchestrator.coordination import control, events, fanout, keys, slot
from orchestrator.errors import RunStateError, RunStorageError
from orchestrator.plan import canvas
from orchestrator.plan.steps import PLAN, Plan, Step
from orchestrator.run import cancels, ending, ids, lease, totals
from orchestrator.run.fence import EpochFence, path
from orchestrator.run.records import CANCELLED, RunStatus, TicketRecord
from orchestrator.run.store import RunStore
from orchestrator.steps.agent import shared_client
from orchestrator.steps.context import Context, Follows, Stop, fan_in
from workers.errors import Cancelled, Superseded

T = TypeVar("T")
DECLARATIONS_DIFFER = "declarations_differ"  # the stop of a ticket a worker refused
Summary = dict[str, Any]

log = logging.getLogger(__name__)

_registered: list[Plan] = []
_HOST = socket.gethostname()


def register(plan: Plan) -> None:
    """Make the app's tasks those of `plan`, replacing any registered before."""
    if _registered:  # another plan's tasks, made on first use: make them now, then replace
        for name in [*(s.task for s in _registered[0]), canvas.FAN_OUT_TASK]:
            app.tasks.pop(name, None)
    for step in plan:
        _per_ticket_task(plan, step) if step.per_ticket else _whole_run_task(plan, step)
    _fan_out_task(plan)
    _registered[:] = [plan]


def registered() -> Plan:
    """The plan the app's tasks run."""
    return _registered[0]


def warm_up() -> None:
    """Build what every task needs once, before worker processes are forked from this one.

    The model client costs about 80 ms to build (its SSL context); built here, each forked
    process starts with it instead of paying for it in its first ticket. Celery looks its
    result backend up (the disabled one) and its control's name matchers up by scanning
    every installed package's entry points, ~10 ms each, and a first send imports the
    modules that build task messages: done here, once, not in every process. None of it
    holds a connection, so nothing is shared across the fork.
    """
    shared_client(worker_llm(), _redis())
    "".encode("idna")  # the first request imports the idna codec
    _ = app.backend, app.control, app.amqp.router  # each made on first use


# --- the three kinds of task ----------------------------------------------------------------


def _whole_run_task(plan: Plan, step: Step) -> None:
    @app.task(name=step.task)
    def whole_run(run_dir: str, attempt: str) -> Summary:
        return _whole_run(plan, step, run_dir, attempt)

    whole_run.__doc__ = f"The whole-run step {step.name} of a run (plan/steps.py)."


def _per_ticket_task(plan: Plan, step: Step) -> None:
    @app.task(name=step.task, bind=True)
    def per_ticket(task: Task, run_dir: str, attempt: str, ticket_id: str) -> Summary:
        return _per_ticket(task, plan, step, run_dir, attempt, ticket_id)

    per_ticket.__doc__ = f"The per-ticket step {step.name} of one ticket (plan/steps.py)."


def _fan_out_task(plan: Plan) -> None:
    @app.task(name=canvas.FAN_OUT_TASK)
    def start_fan_out(run_dir: str, attempt: str, name: str) -> Summary:
        """Start a per-ticket step that follows another one, once its last ticket is done."""
        return _start_fan_out(plan, plan[name], run_dir, attempt)


# --- whole-run steps ------------------------------------------------------------------------


def _whole_run(plan: Plan, step: Step, run_dir: str, attempt: str) -> Summary:
    """Run a whole-run step as the newest copy of it; then send what follows, or end the
    wait of the run's CLI. If the step raises, the run is marked crashed first."""
    ctx = _context(step, run_dir)
    if ctx.meta.status is not RunStatus.RUNNING:  # stopped or timed out while queued
        return {"step": step.name, "status": f"run {ctx.meta.status.value}"}
    r = _redis()
    before = plan.before(step)
    if before is not None and before.per_ticket:
        _take_barrier(r, ctx, attempt, before)
    try:
        result = _fenced(ctx, f"_{step.name}", lambda: _close_then_run(ctx, before, step))
    except Superseded:  # a newer copy of this step goes on
        return {"step": step.name, "status": "superseded"}
    except Cancelled:  # someone cancelled the run: it ended stopped, resume goes on
        totals.recount_quietly(ctx.store)  # with what this step paid before it stopped
        return {"step": step.name, "status": "cancelled"}
    run_id = ctx.store.run_id
    _broker(lambda: events.publish(r, run_id, "node_end", node=step.node), "telling")
    meta = ctx.store.meta()
    if meta.status is not RunStatus.RUNNING:  # it ended the run: its verdict, or a stop
        if meta.status is not RunStatus.DONE:  # a stop, maybe made while this step ran
            totals.recount_quietly(ctx.store)
        code = meta.exit_code
        _broker(lambda: events.publish(r, run_id, "run_end", exit_code=code), "ending a run")
        return {"step": step.name, "exit_code": code}
    taking = result
    pool = meta.config.pool_size
    send = lambda: canvas.send_next(r, plan, step, ctx.store, attempt, taking, pool)  # noqa: E731
    _broker(send, "sending the next step")
    return {"step": step.name, "tickets": len(taking)}


def _close_then_run(ctx: Context, before: Step | None, step: Step) -> list[str]:
    """Close the per-ticket step before `step` (its tickets are all done), run `step`, and
    end the run where its answer (or its row's stop point) says; return the tickets that go
    on to the step after it."""
    if before is not None and before.per_ticket:
        _close_fan_out(ctx, before)
    follows: Follows = step.run(ctx)
    if isinstance(follows, Stop):
        ending.stopped(ctx.store, follows.why)
    elif isinstance(follows, int):
        ending.verdict(ctx.store, follows)
    elif step.stop_point and ctx.meta.config.stop_after == step.name:
        ending.stop_early(ctx.store)  # where the run was asked to stop (exit 2, resumable)
    else:
        return follows
    return []


def _start_fan_out(plan: Plan, step: Step, run_dir: str, attempt: str) -> Summary:
    """The barrier between two per-ticket steps: close the first, fan the second out."""
    before = plan.before(step)
    if before is None:  # the plan's table never lets a fan-out start the run
        raise ValueError(f"{step.name} follows no step: nothing to start it after")
    ctx = _context(before, run_dir)
    if ctx.meta.status is not RunStatus.RUNNING:
        return {"step": step.name, "status": f"run {ctx.meta.status.value}"}
    r = _redis()
    _take_barrier(r, ctx, attempt, before)
    try:
        taking = _fenced(ctx, f"_{step.name}-start", lambda: _closed(ctx, before, step))
    except Superseded:
        return {"step": step.name, "status": "superseded"}
    pool = ctx.store.meta().config.pool_size
    fan = lambda: canvas.fan_out(r, plan, step, ctx.store, attempt, taking, pool)  # noqa: E731
    _broker(fan, "fanning out")
    return {"step": step.name, "tickets": len(taking)}


def _closed(ctx: Context, before: Step, step: Step) -> list[str]:
    """Close `before`, show the run as it stands now, and say which tickets `step` takes."""
    taking = _close_fan_out(ctx, before, step)
    ctx.store.materialise()
    return taking


def _close_fan_out(ctx: Context, step: Step, then: Step | None = None) -> list[str]:
    """Close a per-ticket step's node with the sum of its tickets' usage (and rounds), read
    one record at a time (every ticket is done: nobody writes them now); return the tickets
    `then` takes (those with the status it takes)."""
    taking: list[str] = []

    def each() -> Iterator[TicketRecord]:
        for ticket_id, ticket in ctx.store.records():
            if then is not None and ticket.status is then.takes:
                taking.append(ticket_id)
            yield ticket

    usage, rounds = fan_in(each(), step.name, step.rounds)
    Context(ctx.store, ctx.llm, step.name, step.node).close_node(usage, rounds)
    return taking


def _fenced(ctx: Context, name: str, body: Callable[[], T]) -> T:
    """Run `body` as the newest copy of a whole-run step (fence `name`), under the task's
    time limits and the run's cancel; a crash is recorded and re-raised, a takeover traced
    and re-raised, a cancel raised as `Cancelled` (the run ended stopped already)."""
    ctx.store = ctx.store.fenced(EpochFence.take(path(ctx.store.dir, name)))
    hard = TimeoutError(f"{ctx.step}: still running at the hard time limit")
    try:
        with _cancellable(ctx, None), _limited(ctx, ctx.step, lambda: _crashed(ctx, hard)):
            ctx.cancel.check()  # cancelled before it registered: stop before paying
            return body()
    except Superseded as exc:
        _superseded(ctx, None, exc)
        raise
    except Cancelled:
        raise
    except Exception as exc:
        if _someone_cancelled(ctx):  # the step failed because it was cancelled
            raise Cancelled(ctx.cancel.reason or CANCELLED) from exc
        _crashed(ctx, exc)
        raise
    finally:
        ctx.store.fence.release()  # the epoch file it kept open (run/fence.py)


# --- per-ticket steps -----------------------------------------------------------------------


def _per_ticket(
    task: Task, plan: Plan, step: Step, run_dir: str, attempt: str, ticket_id: str
) -> Summary:
    """Run the message's ticket, then the tickets its slot is handed next, in a row, while
    the row allows (coordination/slot.py); the rest go on by message."""
    row = slot.Row(task.request.id or "", step.task)
    summary = _one_ticket(row, plan, step, run_dir, attempt, ticket_id)
    while (ticket_id := row.take_next()) is not None:
        with row.shown([run_dir, attempt, ticket_id]) as shown:
            summary = _one_ticket(row, plan, step, run_dir, attempt, ticket_id, handed=True)
            shown.update(summary)
    return summary | {"in_a_row": row.count}


def _one_ticket(
    row: slot.Row,
    plan: Plan,
    step: Step,
    run_dir: str,
    attempt: str,
    ticket_id: str,
    handed: bool = False,
) -> Summary:
    """Hold the ticket (one `handed` to the row was held by the handoff that gave it),
    run its step (a failure becomes its verdict), hand its slot on: to the row (`row.next`,
    held for this delivery in the same round trip) if it may run more, else by message."""
    ids.ticket(ticket_id)  # from a message: never made into a path unless a plain name
    ctx, r = _context(step, run_dir), _redis()
    if ctx.meta.status is not RunStatus.RUNNING:
        # Pay nothing. A ticket the row was handed stays held until its hold expires: a
        # stopped run goes on only by `resume`, under a new submission and new keys.
        return {"ticket": ticket_id, "status": f"run {ctx.meta.status.value}"}
    fan = fanout.FanOut(ctx.store.run_id, attempt, step.name)
    limit = int(app.conf.task_time_limit or 0) + 60
    hold = lambda: fanout.hold(r, fan, ticket_id, row.delivery, limit)  # noqa: E731
    if not handed and not _broker(hold, "holding"):
        return {"ticket": ticket_id, "status": "held elsewhere"}

    def hand_on(in_row: bool = True) -> None:
        keep = in_row and row.may_run_more()
        what = f"handing on {ticket_id}"
        send = lambda: canvas.hand_on(  # noqa: E731
            r, plan, step, ctx.store, attempt, ticket_id, row.delivery, keep, limit
        )
        row.next = _broker(send, what)

    try:
        status = _held(ctx, step, ticket_id, row.delivery, hand_on)
    except Superseded as exc:  # a newer copy holds the ticket: it hands the slot on
        _superseded(ctx, ticket_id, exc)
        return {"ticket": ticket_id, "status": "superseded"}
    except (OSError, RunStateError) as exc:
        # The run's files cannot be written (or are damaged): not this ticket's verdict but
        # the run's crash. The ticket's record still says where it was, so `resume` redoes
        # it once fixed.
        _crashed(ctx, exc)
        return {"ticket": ticket_id, "status": "crashed"}
    finally:
        ctx.store.fence.release()  # the epoch file it kept open (run/fence.py)
    return {"ticket": ticket_id, "status": status}


def _held(
    ctx: Context, step: Step, ticket_id: str, delivery: str, hand_on: Callable[..., None]
) -> str:
    """Take the ticket's newest epoch, run the step through it, hand the slot on; a step
    already done (this is a redelivery after its verdict) is only handed on."""
    store = ctx.store
    seen: list[TicketRecord] = []

    def may_take() -> bool:  # under the ticket's fence lock: what it is now
        seen[:] = [store.ticket(ticket_id)]
        return seen[0].status is step.takes

    held = EpochFence.take_if(path(store.dir, ticket_id), may_take)
    if held is None:
        hand_on()
        return store.ticket(ticket_id).status.value
    # Which copy of the step took the ticket, and where: with `superseded`, the trace tells
    # a stalled copy from the one that replaced it; tickets run in a row share a delivery.
    taken = {"epoch": held.epoch, "delivery": delivery, "host": _HOST, "pid": os.getpid()}
    ctx.tracer(ticket=ticket_id).emit("taken", **taken)
    ctx.store = store.fenced(held)
    ctx.store.keep(ticket_id, seen[0])  # read under the lock it now holds: current
    ctx.open_node()
    workspace = Workspace(Path(ctx.meta.workspace))
    if (differ := declarations.mismatch(workspace, ctx.meta.config)) is not None:
        # Another version of the tools or checks than the run's: draft nothing with them.
        status = _failed(ctx, ticket_id, differ, stop=DECLARATIONS_DIFFER)
        hand_on()
        return status

    def out_of_time() -> None:
        error = "still running at the hard time limit; its worker process was replaced"
        _failed(ctx, ticket_id, error, stop=timelimits.TIME_LIMIT)
        hand_on(in_row=False)  # its process exits next: the next ticket gets a message

    try:
        with (
            _cancellable(ctx, ticket_id),
            _limited(ctx, f"{step.name} {ticket_id}", out_of_time),
        ):
            if (cancel := cancels.of(store.dir, ticket_id)) is not None:  # before paying
                status = _failed(ctx, ticket_id, cancel.why, stop=CANCELLED)
            else:
                status = _saved(ctx, ticket_id, step.run(ctx, ticket_id, seen[0]))
    except (OSError, Superseded, RunStateError):
        raise
    except Exception as exc:
        status = _failed(ctx, ticket_id, f"{type(exc).__name__}: {exc}")
    hand_on()
    if ctx.run_ended():  # while this ticket ran: count it in, and show its verdict
        totals.recount_quietly(ctx.store)
    lease.touch(ctx.store)  # the run makes progress: its lease stays live without its CLI
    return status


def _saved(ctx: Context, ticket_id: str, ticket: TicketRecord) -> str:
    """Save the ticket's record a per-ticket step returned, then trace what the step said
    of it; return its status."""
    ctx.store.save_ticket(ticket_id, ticket)
    ctx.told()
    return ticket.status.value


def _failed(ctx: Context, ticket_id: str, error: str, stop: str = "worker_failed") -> str:
    """Record a ticket's failure in its step as its verdict, from its record as saved (what
    the step had not saved is not kept, nor what it would have traced of it)."""
    ctx.untold()
    return _saved(
        ctx, ticket_id, ctx.failed(ticket_id, ctx.store.ticket(ticket_id), error, stop=stop)
    )


# --- what every task shares ------------------------------------------------------------------


def _context(step: Step, run_dir: str) -> Context:
    return Context(RunStore(Path(run_dir)), worker_llm(), step.name, step.node, redis=_redis())


def _redis() -> redis.Redis:
    return keys.client(app.conf.broker_url)


def _broker(fn: Callable[[], T], what: str) -> T:
    """`fn()` through a broker outage; past the window, the message goes back to the queue
    (or stays unacknowledged, and comes back when the broker does)."""
    try:
        return outage.call(fn, float(app.conf.get(OUTAGE_CONF_KEY) or 0), what)
    except outage.BROKER_ERRORS as exc:
        raise Reject(f"broker unreachable while {what}: {exc}", requeue=True) from exc


def _take_barrier(r: redis.Redis, ctx: Context, attempt: str, before: Step) -> None:
    """The barrier after `before`'s fan-out is taken: a sweep never sends it again."""
    fan = fanout.FanOut(ctx.store.run_id, attempt, before.name)
    _broker(lambda: fanout.take_barrier(r, fan), "taking a barrier")


def _cancellable(ctx: Context, ticket_id: str | None) -> contextlib.AbstractContextManager[None]:
    """The step's cancel token watches the run folder (run/cancels.py) and is reached by a
    live cancel (coordination/control.py). Registered before the step looks at the folder, so a
    cancel written after that look still reaches it."""
    ctx.cancel = cancels.Watch(ctx.store.dir, ticket_id)
    return control.running(ctx.store.run_id, ticket_id, ctx.cancel)


def _someone_cancelled(ctx: Context) -> bool:
    return ctx.cancel.cancelled and (ctx.cancel.reason or "").startswith(CANCELLED)


def _limited(
    ctx: Context, what: str, on_hard: Callable[[], None]
) -> contextlib.AbstractContextManager[None]:
    """The task's soft and hard time limits around its step."""
    soft = float(app.conf.task_soft_time_limit or 0)
    hard = float(app.conf.task_time_limit or 0)
    return timelimits.enforced(ctx.cancel, soft, hard, on_hard, what)


def _crashed(ctx: Context, exc: BaseException) -> None:
    """Mark the run crashed and tell its CLI, with the error in the event too: if the run
    folder cannot be written (read-only, disk full), the CLI still learns what happened."""
    error = ending.crash_text(exc)
    if not ((isinstance(exc, OSError) and exc.filename) or isinstance(exc, RunStateError)):
        # An error that names no file (EBADF, say) says nothing of where it happened: its
        # traceback goes to the worker's log. A storage error or a damaged record names its
        # path, and the person reading the terminal gets that one line, not a traceback.
        log.error("run %s crashed in %s: %s", ctx.store.run_id, ctx.step, error, exc_info=exc)
    try:
        ending.crashed(ctx.store, exc)
    except RunStorageError as unrecorded:
        error = str(unrecorded)
        log.error("run %s: the crash could not be recorded: %s", ctx.store.run_id, error)
    run_id = ctx.store.run_id
    _broker(lambda: events.publish(_redis(), run_id, "run_end", error=error), "ending a run")


def _superseded(ctx: Context, ticket_id: str | None, exc: Superseded) -> None:
    """A stale copy steps aside: say so in the trace (and the worker's log)."""
    where = f"{ctx.step} {ticket_id}" if ticket_id else ctx.step
    log.warning("run %s: %s superseded (%s): this copy stops", ctx.store.run_id, where, exc)
    fields = {"ticket": ticket_id} if ticket_id else {}
    ctx.tracer(**fields).emit("superseded", epoch=exc.epoch, newest=exc.newest)


register(PLAN)
