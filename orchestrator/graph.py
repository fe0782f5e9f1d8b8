"""The plan of a run, as one Celery canvas.

    route ─▶ chord(lanes of draft(ticket), merge) ─▶ chord(lanes of review(ticket), report)

Tickets are dealt round-robin into `pool_size` lanes; each lane is a chain, so at most
`pool_size` tickets of a run are in flight however many workers listen. Every task takes the
run folder and a ticket id, never a payload.
"""

from __future__ import annotations

from celery import Task, chain, chord
from celery.canvas import Signature

from orchestrator import tasks


def plan(run_dir: str, ticket_ids: list[str], pool_size: int, stop_after: str | None) -> Signature:
    """The canvas of one run; it stops after merge when asked to."""
    steps = [
        tasks.route.si(run_dir),
        chord(lanes(tasks.draft, run_dir, ticket_ids, pool_size), tasks.merge.si(run_dir)),
    ]
    if stop_after != "merge":
        steps.append(
            chord(lanes(tasks.review, run_dir, ticket_ids, pool_size), tasks.report.si(run_dir))
        )
    return chain(*steps)


def lanes(task: Task, run_dir: str, ticket_ids: list[str], pool_size: int) -> list[Signature]:
    """`pool_size` chains of per-ticket tasks, tickets dealt round-robin."""
    width = max(1, min(pool_size, len(ticket_ids)))
    return [chain(*(task.si(run_dir, t) for t in ticket_ids[lane::width])) for lane in range(width)]
