"""The plan is one table: a step is one row and one function.

The demo runs through a plan with one more per-ticket step, declared here alone: `stamp`,
between merge and review, adds a footer to each published reply. Nothing else changes: its
task, its fan-out, its node and its line in the report come from the row.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.workspace import Workspace
from orchestrator.plan.steps import PLAN, Plan, Scope, Step
from orchestrator.run import ids
from orchestrator.run.records import StepUsage, TicketRecord, TicketStatus
from orchestrator.steps.context import Context
from orchestrator.steps.report import usd
from tests.conftest import (
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    REPO,
    clean_env,
    node_numbers,
    state,
    ticket_rows,
)
from tests.orchestrator.web.test_app import client

FOOTER = "-- answered with ticketgraph"


def stamp(ctx: Context, ticket_id: str, ticket: TicketRecord) -> TicketRecord:
    """Add the footer to the ticket's reply in out/ (once), and say so in the trace."""
    path = ids.out_file(Workspace(Path(ctx.meta.workspace)), ticket_id)
    text = path.read_text(encoding="utf-8")
    if FOOTER not in text:
        ctx.store.write(path, f"{text.rstrip()}\n{FOOTER}\n")
    ctx.tracer(ticket=ticket_id).emit("stamped")
    return ticket


STAMP = Step(
    "stamp", Scope.TICKET, stamp, takes=TicketStatus.DRAFTED, leaves=(TicketStatus.DRAFTED,)
)
PLAN_WITH_STAMP = PLAN.with_step(STAMP, after="merge")

RUN_WITH_STAMP = (
    "from orchestrator.plan import tasks\n"
    "from tests.orchestrator.plan.test_plan import PLAN_WITH_STAMP\n"
    "tasks.register(PLAN_WITH_STAMP)\n"
    "from orchestrator.cli.main import main\n"
    "raise SystemExit(main(['run']))\n"
)

# What `appraise` pays for each ticket it takes (as if it asked a model once).
APPRAISAL = StepUsage(calls=1, tokens=40, cost_usd=0.0125)


def appraise(ctx: Context, ticket_id: str, ticket: TicketRecord) -> TicketRecord:
    """Pay APPRAISAL for the ticket, as a step with a model call would."""
    ticket.spend(ctx.step, APPRAISAL)
    return ticket


PLAN_WITH_APPRAISAL = PLAN.with_step(
    Step("appraise", Scope.TICKET, appraise, TicketStatus.DRAFTED, (TicketStatus.DRAFTED,)),
    after="merge",
)
RUN_WITH_APPRAISAL = RUN_WITH_STAMP.replace("PLAN_WITH_STAMP", "PLAN_WITH_APPRAISAL")


def test_the_plan_reads_as_its_table() -> None:
    assert [s.name for s in PLAN] == ["route", "draft", "merge", "review", "report"]
    assert PLAN.nodes == ("route", "fanout", "merge", "review", "report")
    assert [s.name for s in PLAN_WITH_STAMP] == [
        "route",
        "draft",
        "merge",
        "stamp",
        "review",
        "report",
    ]
    assert PLAN_WITH_STAMP.before(PLAN_WITH_STAMP["review"]) is PLAN_WITH_STAMP["stamp"]


def test_a_plan_that_does_not_hang_together_is_refused() -> None:
    route, report = PLAN["route"], PLAN["report"]
    with pytest.raises(ValueError, match="followed by"):
        Plan((route, report))  # route says draft comes next
    with pytest.raises(ValueError, match="must end"):
        Plan((route,))


def test_a_step_declared_in_a_test_alone_runs_as_one_row_and_one_function(demo: Path) -> None:
    """The demo through route, draft, merge, stamp, review, report: the reference verdicts
    and node figures, a stamp node with a line in the report, a `stamped` event and a
    footer for every reply that review did not rewrite."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITH_STAMP],
        cwd=demo,
        env={**clean_env(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    assert node_numbers(record) == REFERENCE_NODES
    assert record["nodes"]["stamp"]["status"] == "ok" and record["nodes"]["stamp"]["calls"] == 0
    trace = [json.loads(line) for line in (demo / "run.jsonl").read_text().splitlines()]
    stamped = sorted(e["ticket"] for e in trace if e["event"] == "stamped")
    assert stamped == sorted(REFERENCE_TICKETS)
    assert all(e["node"] == "stamp" for e in trace if e["event"] == "stamped")
    rewritten = {"T-1004", "T-1005"}  # their rewrites replaced the stamped drafts
    for ticket in REFERENCE_TICKETS:
        reply = (demo / "out" / f"{ticket}.txt").read_text()
        assert (FOOTER in reply) is (ticket not in rewritten), ticket
    report = (demo / "runs" / record["run_id"] / "report.txt").read_text()
    rows = [line.split()[0] for line in report.splitlines()[2:7]]
    assert rows == ["route", "fanout", "merge", "stamp", "review"]


def test_what_a_step_declared_in_a_test_alone_pays_shows_in_the_report_progress_and_web(
    demo: Path,
) -> None:
    """`appraise`, a row and a function here, pays for each ticket: its node's cost, each
    ticket's cost and the run's include it in the report, its progress line says it, and the
    web view's run and ticket pages show it; no other file names the step."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITH_APPRAISAL],
        cwd=demo,
        env={**clean_env(), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    assert node_numbers(record) == REFERENCE_NODES
    n = len(REFERENCE_TICKETS)
    node = record["nodes"]["appraise"]
    assert (node["calls"], node["tokens"]) == (n, n * APPRAISAL.tokens)
    assert node["cost_usd"] == pytest.approx(n * APPRAISAL.cost_usd)
    progress = f"[appraise] {n} model calls, {n * APPRAISAL.tokens} tokens, "
    progress += usd(n * APPRAISAL.cost_usd)
    assert progress in done.stdout.splitlines(), done.stdout
    assert (
        done.stdout.index("[merge]") < done.stdout.index(progress) < done.stdout.index("[review]")
    )

    report = (demo / "runs" / record["run_id"] / "report.txt").read_text().splitlines()
    rows = {line.split()[0]: line.split() for line in report if line.strip()}
    assert rows["appraise"][-1] == usd(n * APPRAISAL.cost_usd)
    nodes_paid = sum(v["cost_usd"] for v in record["nodes"].values())
    assert f"Cost of the run: {usd(nodes_paid)}" in report
    for ticket_id, ticket in record["tickets"].items():
        assert ticket["spent"]["appraise"]["cost_usd"] == APPRAISAL.cost_usd
        paid = ticket["draft"]["cost_usd"] + ticket["review"]["cost_usd"] + APPRAISAL.cost_usd
        assert rows[ticket_id][-1] == usd(paid), ticket_id

    with client(demo) as web:
        run_page = web.get(f"/runs/{record['run_id']}").text
        assert re.search(
            rf"<td>appraise</td>.*<td>{re.escape(usd(n * APPRAISAL.cost_usd))}</td>", run_page
        )
        ticket_page = web.get(f"/runs/{record['run_id']}/tickets/T-1001").text
        assert f"appraise {usd(APPRAISAL.cost_usd)}" in ticket_page
