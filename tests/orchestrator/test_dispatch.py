"""A worker thread that finishes a task takes the next message at once: the worker's pool
wakes the consumer's loop (broker/pool.py), so dispatch does not wait for the loop's idle
timer (about a second) when Celery's task events are off, as they are in embedded runs."""

from __future__ import annotations

from pathlib import Path

from tests.orchestrator.conftest import REFERENCE_TICKETS, Cli, state, ticket_rows


def test_one_thread_runs_the_demo_without_waiting_between_tasks(demo: Path, cli: Cli) -> None:
    done = cli("run", "--quiet", cwd=demo, env={"POOL_SIZE": "1", "TICKETGRAPH_PROCESSES": "1"})
    assert done.returncode == 1, done.stderr
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    # 12 per-ticket tasks one after another on one thread (6 drafts, 6 reviews): the model
    # answers in 60 ms (10 calls). Without the wake-up each task waited ~1 s for the loop
    # (fanout 5.0 s, review 6.0 s measured); with it, 0.6 s and 0.2 s. Half a second per task
    # is the line between the two, an order of magnitude above what a task needs here.
    per_ticket_ms = record["nodes"]["fanout"]["ms"] + record["nodes"]["review"]["ms"]
    assert per_ticket_ms < 12 * 500, record["nodes"]
