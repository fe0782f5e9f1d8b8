"""Thin Celery tasks: take references (a run folder, a ticket id), call the node, return
references. Drafting and review tasks never raise into their chord: a failure is recorded on
the ticket and the task returns normally (a raising header task would hand merge a ChordError).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from orchestrator import nodes
from orchestrator.app import app, worker_llm
from orchestrator.runstate import RunStore, record_crash

T = TypeVar("T")


def _ctx(run_dir: str) -> nodes.Context:
    return nodes.Context(store=RunStore(Path(run_dir)), llm=worker_llm())


def _crash_on_error(run_dir: str, step: Callable[[nodes.Context], T]) -> T:
    """Run a whole-run step; if it raises, the run is marked crashed before Celery sees it."""
    try:
        return step(_ctx(run_dir))
    except Exception as exc:
        record_crash(RunStore(Path(run_dir)), exc)
        raise


def _per_ticket(
    run_dir: str, ticket_id: str, node: str, step: Callable[[nodes.Context, str], T]
) -> T | dict[str, str]:
    """Run a per-ticket step; a failure becomes the ticket's verdict, never a chord error."""
    ctx = _ctx(run_dir)
    try:
        return step(ctx, ticket_id)
    except Exception as exc:
        return nodes.fail_ticket(ctx, ticket_id, node, f"{type(exc).__name__}: {exc}")


@app.task(name="orchestrator.route")
def route(run_dir: str) -> dict[str, int]:
    """Classify every claimed ticket with one model call."""
    return _crash_on_error(run_dir, nodes.route)


@app.task(name="orchestrator.draft")
def draft(run_dir: str, ticket_id: str) -> dict[str, str]:
    """Draft one ticket; a failure becomes that ticket's verdict."""
    return _per_ticket(run_dir, ticket_id, "fanout", nodes.draft)


@app.task(name="orchestrator.merge")
def merge(run_dir: str) -> dict[str, int]:
    """Publish drafts to out/ and collect references."""
    return _crash_on_error(run_dir, nodes.merge)


@app.task(name="orchestrator.review")
def review(run_dir: str, ticket_id: str) -> dict[str, str]:
    """Gate and rewrite one draft; a failure becomes that ticket's verdict."""
    return _per_ticket(run_dir, ticket_id, "review", nodes.review)


@app.task(name="orchestrator.report")
def report(run_dir: str) -> dict[str, int]:
    """Render the report and record the exit code."""
    return _crash_on_error(run_dir, nodes.finish_report)
