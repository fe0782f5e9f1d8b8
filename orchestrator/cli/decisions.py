"""A person's decisions on a run: `pending` (what waits), `approve` and `reject` (a call
that waits), `cancel` (a run or its tickets) and `requeue` (a run's tickets back into
inbox/). The work is orchestrator/submission/decisions.py's; this module parses and prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.cli.options import (
    F,
    broker_option,
    by_option,
    json_option,
    reason_option,
    renamed,
    wait_for_workers_option,
    workspace_option,
)
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace


@click.command()
@workspace_option
@json_option("Print a JSON list.")
def pending(workspace: Workspace, as_json: bool) -> int:
    """List the tool calls that wait for a person's decision, in every run.

    Every call a worker stopped for (its tool's approval policy wants a person): the run,
    the ticket, the tool, its arguments, how long it has waited, and the commands that
    decide it.
    """
    from orchestrator.submission import decisions

    print(decisions.pending_text(workspace.require(), as_json), end="")
    return ExitCode.ALL_PASS


def _decision_options(f: F) -> F:
    """RUN_ID TICKET, --workspace, --call and --by: which call a decision is on, and who."""
    f = by_option("decides")(f)
    f = click.option("--call", "call_id", help="The call (when the ticket waits with several).")(f)
    f = workspace_option(f)
    f = click.argument("ticket")(f)
    return click.argument("run_id")(f)


@click.command()
@_decision_options
def approve(
    run_id: str, ticket: str, workspace: Workspace, call_id: str | None, by: str | None
) -> int:
    """Approve the call TICKET of RUN_ID waits with (it runs, once, on `resume`).

    The decision is recorded in the run folder at once, from any machine that sees the
    workspace, with or without workers or Redis: who, when, and the hash of the arguments
    it was made for, signed with your key (`ticketgraph keys init`; exit 78 without one). A
    second decision on the same call, a call whose arguments changed, or an unknown call is
    refused (exit 64). `ticketgraph resume RUN_ID` then finishes the
    ticket, paying only for the model turns after the decision.
    """
    from orchestrator.submission import decisions

    print(decisions.decide(workspace, run_id, ticket, call_id, True, by, ""), end="")
    return ExitCode.ALL_PASS


@click.command()
@_decision_options
@reason_option("Why: the worker's model reads it.", required=True)
def reject(
    run_id: str, ticket: str, workspace: Workspace, call_id: str | None, by: str | None, reason: str
) -> int:
    """Reject the call TICKET of RUN_ID waits with (it never runs; the model is told why).

    Recorded like an approval (who, when, the reason, the arguments' hash); on `resume` the
    ticket's worker hears that a person declined the call, with the reason, and writes its
    reply knowing it.
    """
    from orchestrator.submission import decisions

    print(decisions.decide(workspace, run_id, ticket, call_id, False, by, reason), end="")
    return ExitCode.ALL_PASS


@click.command()
@click.argument("run_id")
@workspace_option
@click.option(
    "--ticket",
    "tickets",
    multiple=True,
    metavar="ID",
    help="Cancel only this ticket (repeat for several); default: the whole run.",
)
@reason_option("Why: recorded, and shown by status and resume.", default="")
@by_option("cancels")
@broker_option("TICKETGRAPH_BROKER_URL")
@wait_for_workers_option(10.0, "How long to wait for every worker process to confirm.")
# The former spelling: `resume --wait` is a flag (wait for the run's lease), so cancel's
# seconds took the name run and resume give theirs.
@renamed("--wait", "wait_for_workers", "--wait-for-workers", type=click.FloatRange(min=0))
def cancel(
    run_id: str,
    workspace: Workspace,
    tickets: tuple[str, ...],
    reason: str,
    by: str | None,
    broker: str | None,
    wait_for_workers: float,
) -> int:
    """Cancel RUN_ID (or some of its tickets) from any machine that reaches its broker.

    The cancel is recorded in the run folder first: from then on no task and no model
    request of the run starts on any worker, also after every worker restarted. Then every
    worker process is told through the broker: the run's model requests in flight are cut
    and its tools stopped, and each process confirms; the command returns once all have.
    A cancelled run ends stopped (its waiting `run` exits 2) with the reason; a cancelled
    ticket ends needs_human (stop `cancelled`). `ticketgraph resume RUN_ID` goes on from
    there, paying only for new model turns. Cancelling a finished run changes nothing.
    Without a broker here (an embedded run), the run's own command delivers it.
    """
    from orchestrator.config import environment
    from orchestrator.submission import decisions

    url = environment.settings(broker, None).broker_url
    text = decisions.cancel(workspace, run_id, list(tickets), by, reason, url, wait_for_workers)
    print(text, end="")
    return ExitCode.ALL_PASS


@click.command()
@click.argument("run_id")
@click.argument("tickets", nargs=-1, metavar="[TICKET]...")
@workspace_option
@click.option(
    "--force",
    is_flag=True,
    help="Put back also a ticket whose write tools ran or that waits for a decision (a new "
    "run would do those again; the ledger answers writes it holds unless --repeat-writes).",
)
@click.option(
    "--repeat-writes",
    is_flag=True,
    help="Make the tickets' writes again (a refund filed twice): new idempotency keys, so "
    "neither the ledger nor the tools' APIs answer them from before. Recorded with who asked.",
)
def requeue(
    run_id: str, tickets: tuple[str, ...], workspace: Workspace, force: bool, repeat_writes: bool
) -> int:
    """Put a run's ticket files back into inbox/.

    Move the files run RUN_ID claimed (all, or those of the named tickets) from
    runs/RUN_ID/claimed/ back into inbox/, where the next run claims them again. A file whose
    name is taken in inbox/ is left where it is. Refuses (exit 75) while the run is still
    being worked on. A run whose claim a crash cut short no longer stops later runs once
    all its files are back. A ticket whose write tools ran (actions.jsonl), or that waits for
    a decision, is put back only with --force (or --repeat-writes): without it the command
    names what would run again and what the workspace's ledger would answer, and exits 64,
    moving nothing. Each write the tickets made (a refund) is listed with what the next run
    does with it: answered from the ledger (not made again), or run again; --repeat-writes
    makes them all again.
    """
    from orchestrator.submission import decisions

    text = decisions.requeue(workspace, run_id, list(tickets), None, force, repeat_writes)
    print(text, end="")
    return ExitCode.ALL_PASS


COMMANDS = (pending, approve, reject, cancel, requeue)
