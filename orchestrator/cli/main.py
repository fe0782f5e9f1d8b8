"""The `ticketgraph` command: the group, and the command modules it registers.

Each command lives in the module of its concern: run.py (run, resume), decisions.py
(pending, approve, reject, cancel, requeue), inspection.py (init, scenarios, check, status,
runs), serving.py (worker, flower, web, provider), harness.py, people.py (queue, handle,
audit, labels, gate), evaluation.py (eval) and keys.py. Options several commands share are
declared once (options.py); failures are mapped to exit codes once, for every command, at
registration (failures.py): one sentence on stderr, never a traceback.

Usage errors exit 64 (EX_USAGE), not click's 2, which cron would read as "stopped early",
and name the closest command or flag.

Each handler imports the rooms it calls when it runs: this module loads in a few tens of
milliseconds, so `--help`, `status` or a misspelt flag do not pay for Celery, redis-py and
the harness (half a second here).
"""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from orchestrator.cli import (
    decisions,
    evaluation,
    harness,
    inspection,
    keys,
    people,
    run,
    serving,
)
from orchestrator.cli.failures import report_errors
from orchestrator.cli.group import CONTEXT, Commands, explain_alike
from orchestrator.exit_codes import ExitCode

MODULES = (run, decisions, inspection, serving, harness, people, evaluation, keys)


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


def _version(_ctx: click.Context) -> str:
    """`--version`'s line: the installed package's version, looked up only when asked
    (importing importlib.metadata and reading the package's metadata would cost every other
    command ~15 ms before its first line of work)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"ticketgraph {version('ticketgraph')}"
    except PackageNotFoundError:
        return "ticketgraph unknown (not installed)"


@click.group(cls=Commands, context_settings=CONTEXT)
@click.custom_version_option(_version)
def cli() -> None:
    """Route support tickets, draft replies with LLM agent workers on Celery, review every
    draft, and report with an exit code cron can check."""


for _module in MODULES:
    for _command in _module.COMMANDS:
        cli.add_command(_command)
explain_alike(cli)
report_errors(cli)


if __name__ == "__main__":
    sys.exit(main())
