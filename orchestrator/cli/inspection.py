"""Looking at a workspace and its runs: `init` (make one), `scenarios init` (script its
inbox), `check` (would a run start?), `status` (a run) and `runs` (the recent ones). None
of them claims a ticket or pays for a model call."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.group import Commands
from orchestrator.cli.options import choice_option, count_option, json_option, workspace_option
from orchestrator.cli.settings import checked
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace


@click.command()
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@choice_option(
    "--template",
    choices=["demo", "minimal"],
    help="demo: the lesson's six tickets, two workers, a template and scripted replies; "
    "minimal: a start of your own (two example workers, a template, a tools module "
    "skeleton, a real model's settings, no scripts).",
)
def init(folder: Path, template: str) -> int:
    """Create a workspace (the demo, or a start of your own).

    Create a workspace in FOLDER from a template: its ticketgraph.toml (the categories and
    the worker of each), prompts/, templates/, a tools module, inbox/ and out/; the demo
    also has six tickets, kb/, data/, scenarios/demo.yaml for the scripted provider and
    examples/ (two tickets whose refunds wait for a person, for README's approvals).
    Existing files are never overwritten.
    """
    from orchestrator.cli.console import plural
    from orchestrator.config.workspace import init as make
    from orchestrator.run import signing

    created, kept = make(folder, template)
    files = plural(len(created), "file")
    print(f"{template} workspace in {folder}: {files} created, {len(kept)} kept as they were")
    for path in kept:
        print(f"  kept {path}")
    print(f"decisions are signed with {signing.private_path()} (yours; keep it private); the")
    print(f"  workers verify them with its public half in {folder}/{signing.KEYS}/")
    if template == "demo":
        print(f"next: cd {folder} && ticketgraph run")
    else:
        print(f"next: edit {folder}/ticketgraph.toml, then cd {folder} && ticketgraph check")
    return ExitCode.ALL_PASS


@click.group(cls=Commands)
def scenarios() -> None:
    """The workspace's scripted replies (scenarios/demo.yaml), served when no LLM_BASE_URL
    is set."""


@scenarios.command("init")
@workspace_option
def scenarios_init(workspace: Workspace) -> int:
    """Script the tickets in inbox/, to run them offline.

    Add to the workspace's scenarios/demo.yaml what the tickets in inbox/ need to run
    without a model: a line `<ticket id>: CATEGORY` in the router's reply for each ticket it
    does not name yet, and a script per ticket whose reply is REPLY. Replace each CATEGORY
    with one of the workspace's categories and each REPLY with the reply its worker should
    give, then `ticketgraph run`. What the file already says is kept; run it again when new
    tickets arrive. Nothing in inbox/ is moved.
    """
    from orchestrator.steps import scripted

    print(scripted.add_for_inbox(workspace.require()).said(), end="")
    return ExitCode.ALL_PASS


@click.command("check")
@workspace_option
def check_workspace(workspace: Workspace) -> int:
    """Check a workspace and show what each category would run (claims and pays nothing).

    Check the workspace as `run` does before it claims anything: ticketgraph.toml (every
    table and key), each worker's prompt, the tools and checks it imports, the model
    endpoint (LLM_BASE_URL, or scripted replies to try it offline), each template, the
    routing prompt; then print each category's worker (model, caps, tools, readable
    files) or template. Exit 0 when a run would start, 78 naming the first problem.
    """
    from orchestrator.cli import check
    from workers.settings import HarnessSettings, load

    settings = checked(None, None)
    print(check.check(workspace, settings, load(HarnessSettings, "LLM_")), end="")
    return ExitCode.ALL_PASS


@click.command("status")
@click.argument("run_id", required=False)
@workspace_option
@json_option("Print one JSON document.")
def show_status(run_id: str | None, workspace: Workspace, as_json: bool) -> int:
    """Show a run as it stands (the newest, or RUN_ID).

    Show one run of this workspace, running or finished, from its folder: status and exit
    code, tickets by status, each node's time, calls, tokens and cost, and the tickets that
    need a human with the reason, and what it may spend and has spent (read live from the
    ledger in TICKETGRAPH_BROKER_URL's Redis while a run with a budget runs). --json prints
    one document instead (schema: docs/run-document.schema.json): schema_version, run_id,
    status, verdict, exit_code, tickets, by_status, cost_usd, duration_s, report, budget and
    record (the run-state.json record of every node and ticket).
    """
    from orchestrator.coordination import budget
    from orchestrator.run.records import RunStatus
    from orchestrator.submission import status

    found = status.find(workspace, run_id)
    record, handled = found.read(), status.handled_of(found)
    if record.status is RunStatus.RUNNING and budget.limits(record.config).any:
        broker_url = os.environ.get("TICKETGRAPH_BROKER_URL")  # a live ledger is there
        record.budget = budget.read_live(broker_url, record.run_id) or record.budget
    if as_json:
        print(json.dumps(status.document(record, handled=handled), indent=2))
    else:
        print(status.text(record, handled), end="")
    return ExitCode.ALL_PASS


@click.command()
@workspace_option
@count_option("--limit", "-n", default=20, help="How many runs.")
@json_option("Print a JSON list.")
def runs(workspace: Workspace, limit: int, as_json: bool) -> int:
    """List the recent runs with verdict, tickets, cost and duration.

    List this workspace's recent runs, newest first: started, verdict (all_pass,
    needs_human, stopped, crashed, running), exit code, tickets, how many need a human, cost
    and duration. --json prints a JSON list of the same fields.
    """
    from orchestrator.submission import status

    rows = status.recent(workspace, limit)
    if as_json:
        print(json.dumps([row.model_dump() for row in rows], indent=2))
    elif not rows:
        print(f"no runs under {workspace.runs} yet")
    else:
        print(status.runs_table(rows), end="")
    return ExitCode.ALL_PASS


COMMANDS = (init, scenarios, check_workspace, show_status, runs)
