"""A worker thread that finishes a task takes the next message at once: the worker's pool
wakes the consumer's loop (broker/pool.py), so dispatch does not wait for the loop's idle
timer (about a second) when Celery's task events are off, as they are in embedded runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery.worker import state as worker_state

from orchestrator.coordination import slot
from tests.conftest import REFERENCE_TICKETS, Cli, events, state, ticket_rows


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


def test_one_slot_runs_its_step_s_tickets_in_a_row_under_one_message(demo: Path, cli: Cli) -> None:
    # Pool 1: each per-ticket step has one slot. Its first ticket arrives by message and the
    # slot runs the ones it is handed next itself (coordination/slot.py), so every ticket of a step
    # is taken under the same delivery; the two steps are two messages.
    done = cli("run", "--quiet", cwd=demo, env={"POOL_SIZE": "1", "TICKETGRAPH_PROCESSES": "1"})
    assert done.returncode == 1, done.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    taken: dict[str, dict[str, str]] = {}
    for event in events(demo):
        if event["event"] == "taken":
            taken.setdefault(event["node"], {})[event["ticket"]] = event["delivery"]
    assert set(taken["fanout"]) == set(REFERENCE_TICKETS), taken
    assert set(taken["review"]) == set(REFERENCE_TICKETS), taken
    assert len(set(taken["fanout"].values())) == 1, taken
    assert len(set(taken["review"].values())) == 1, taken
    assert taken["fanout"]["T-1001"] != taken["review"]["T-1001"]


def test_a_row_hands_its_slot_on_by_message_past_its_bound_or_when_its_worker_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = slot.Row("delivery-1", "orchestrator.fanout")
    assert row.may_run_more()
    row.next = "T-1"
    assert row.take_next() == "T-1" and row.take_next() is None and row.count == 1
    monkeypatch.setattr(worker_state, "should_stop", 0)  # a warm shutdown began
    assert not row.may_run_more()
    monkeypatch.setattr(worker_state, "should_stop", None)
    row.count = slot.MAX_TICKETS
    assert not row.may_run_more()
    row.count, row.started = 0, row.started - slot.MAX_S
    assert not row.may_run_more()
