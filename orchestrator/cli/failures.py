"""What a command's failure becomes: one sentence on stderr and the exit code of its kind
(64 usage, 75 try again later, 78 configuration, 3 crash), never a traceback. Mapped here
once, for every command of the group, when main.py registers them (`report_errors`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from orchestrator.errors import ConfigError, GraphError, RunBusy, UsageError
from orchestrator.exit_codes import ExitCode


def report_errors(group: click.Group, prefix: str = "") -> None:
    """Every command under `group` (nested ones too) reports its failures as `reports`
    says, under the name it is called by (`run`, `keys init`)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            report_errors(command, f"{prefix}{name} ")
        elif command.callback is not None:
            command.callback = reports(prefix + name)(command.callback)


def reports(name: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """A handler whose failures are one sentence on stderr and the exit code of their kind;
    anything else (a bug) keeps its traceback."""

    def wrap(handler: Callable[..., int]) -> Callable[..., int]:
        @wraps(handler)
        def run(*args: Any, **kwargs: Any) -> int:
            try:
                return handler(*args, **kwargs)
            except BrokenPipeError:
                return _reader_left()
            except Exception as exc:
                if not _ours(exc):
                    raise
                return failed(name, exc)

        return run

    return wrap


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


def _ours(exc: Exception) -> bool:
    """A failure a command reports in a sentence: ours (the graph's, the harness's), the
    system's (OSError) or a setting that does not validate."""
    from workers.errors import HarnessError

    return isinstance(exc, GraphError | HarnessError | OSError) or _a_bad_setting(exc)


def _reader_left() -> int:
    """stdout's reader went away (`status | head`): what it read is what it wanted, so the
    command ends quietly, as `cat | head` does (`run` and `resume` go on: console.say)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return ExitCode.ALL_PASS


def _a_bad_setting(exc: Exception) -> bool:
    """A setting that does not validate (the environment's, or a record's fields)."""
    from pydantic import ValidationError

    from workers.settings import SettingsError

    return isinstance(exc, ValidationError | SettingsError)
