"""Thin Celery tasks: take references (a run folder, the submission's attempt id, a ticket id),
call the node, send what the plan says comes next, and return a small summary.

Per-ticket tasks never raise: a failure is recorded on the ticket and its slot is handed on,
so one bad ticket cannot stall its fan-out. Whole-run steps that raise mark the run crashed
and tell the waiting CLI before Celery sees the error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis
from celery import Task

from orchestrator import dispatch, graph, keys, lease, nodes
from orchestrator.agents import shared_client
from orchestrator.app import app, worker_llm
from orchestrator.records import RunPhase
from orchestrator.runstate import RunStore

T = TypeVar("T")


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


def _whole_run(run_dir: str, step: Callable[[nodes.Context], T]) -> T:
    """Run a whole-run step; if it raises, the run is marked crashed before Celery sees it."""
    ctx = _ctx(run_dir)
    try:
        return step(ctx)
    except Exception as exc:
        nodes.record_crash(ctx.store, exc)
        dispatch.publish(_redis(), ctx.store.run_id, "run_end")
        raise


def _per_ticket(
    task: Task, step: graph.FanOut, run_dir: str, attempt: str, ticket_id: str
) -> dict[str, str]:
    """Hold the ticket, run its step (a failure becomes its verdict), hand its slot on."""
    ctx, r = _ctx(run_dir), _redis()
    phase = dispatch.Phase(ctx.store.run_id, attempt, step.phase)
    limit = int(app.conf.task_time_limit or 0) + 60
    if not dispatch.hold(r, phase, ticket_id, task.request.id or "", limit):
        return {"ticket": ticket_id, "status": "held elsewhere"}
    node = "fanout" if step is graph.DRAFT else "review"
    run = nodes.draft if step is graph.DRAFT else nodes.review
    try:
        status = run(ctx, ticket_id)
    except Exception as exc:
        status = nodes.fail_ticket(ctx, ticket_id, node, f"{type(exc).__name__}: {exc}")
    graph.hand_on(r, step, ctx.store, attempt, ticket_id)
    lease.touch(ctx.store)  # the run makes progress: its lease stays live without its CLI
    return {"ticket": ticket_id, "status": status}


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
    taking = _whole_run(run_dir, step)
    r = _redis()
    dispatch.publish(r, ctx.store.run_id, "node_end", node=node)
    if ctx.store.meta().status is not RunPhase.RUNNING:
        dispatch.publish(r, ctx.store.run_id, "run_end")
        return {fan.phase: 0}
    graph.fan_out(r, fan, ctx.store, attempt, taking, ctx.meta.config.pool_size)
    return {fan.phase: len(taking)}


@app.task(name="orchestrator.draft", bind=True)
def draft(self: Task, run_dir: str, attempt: str, ticket_id: str) -> dict[str, str]:
    """Draft one ticket; a failure becomes that ticket's verdict."""
    return _per_ticket(self, graph.DRAFT, run_dir, attempt, ticket_id)


@app.task(name="orchestrator.merge")
def merge(run_dir: str, attempt: str) -> dict[str, int]:
    """Publish drafts to out/, then fan the reviews out (unless the run stops here)."""
    return _then_fan_out(run_dir, attempt, "merge", nodes.merge, graph.REVIEW)


@app.task(name="orchestrator.review", bind=True)
def review(self: Task, run_dir: str, attempt: str, ticket_id: str) -> dict[str, str]:
    """Gate and rewrite one draft; a failure becomes that ticket's verdict."""
    return _per_ticket(self, graph.REVIEW, run_dir, attempt, ticket_id)


@app.task(name="orchestrator.report")
def report(run_dir: str, attempt: str) -> dict[str, int]:
    """Render the report, record the exit code, and tell the waiting CLI."""
    code = _whole_run(run_dir, nodes.finish_report)
    dispatch.publish(_redis(), RunStore(Path(run_dir)).run_id, "run_end", exit_code=code)
    return {"exit_code": code}
