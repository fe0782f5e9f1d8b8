"""The options several commands share, declared once (as rq's CLI shares `url_option`): each
flag has one spelling and one meaning across the commands; a command says in its own words
what the flag does there (`--json`'s document, who `--by` names)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from orchestrator.cli.console import Mode
    from orchestrator.config.workspace import Workspace

F = Callable[..., Any]


def workspace_option(f: F) -> F:
    """--workspace DIR (default: the current folder), handed to the command as a `Workspace`."""
    return click.option(
        "--workspace",
        type=click.Path(path_type=Path, file_okay=False),
        default=Path("."),
        show_default=True,
        callback=_workspace,
        help="Workspace folder.",
    )(f)


def _workspace(_ctx: click.Context, _param: click.Parameter, value: Path) -> Workspace:
    from orchestrator.config.workspace import Workspace  # lazy: `--help` reads no workspace

    return Workspace(value)


def listen_options(address: str, port: int) -> Callable[[F], F]:
    """--address and --port of a command that serves HTTP (flower, web)."""

    def add(f: F) -> F:
        f = click.option(
            "--port", type=click.IntRange(1, 65535), default=port, show_default=True, help="Port."
        )(f)
        return click.option(
            "--address",
            default=address,
            show_default=True,
            help="Address to listen on (0.0.0.0 for every interface: then put TLS in front).",
        )(f)

    return add


def broker_option(help_default: str = "TICKETGRAPH_BROKER_URL, else embedded") -> Callable[[F], F]:
    """--broker URL."""
    return click.option("--broker", metavar="URL", help=f"Redis URL (default: {help_default}).")


def json_option(help: str) -> Callable[[F], F]:
    """--json: print a document for a program instead of text (the handler's `as_json`)."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def by_option(who: str) -> Callable[[F], F]:
    """--by NAME: who does it, recorded with it (the handler's `by`; None: the user name)."""
    return click.option("--by", help=f"Who {who} (default: your user name).")


def reason_option(help: str, **kwargs: Any) -> Callable[[F], F]:
    """--reason TEXT: why a person did it, recorded with it."""
    return click.option("--reason", help=help, **kwargs)


def wait_for_workers_option(default: float, help: str) -> Callable[[F], F]:
    """--wait-for-workers SECONDS: how long to wait for the workers' answer."""
    return click.option(
        "--wait-for-workers",
        type=click.FloatRange(min=0),
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


def file_option(*decls: str, help: str, exists: bool = False, **kwargs: Any) -> Callable[[F], F]:
    """An option naming one file (a `Path`; with `exists`, one that must be there)."""
    kind = click.Path(path_type=Path, dir_okay=False, exists=exists)
    return click.option(*decls, type=kind, help=help, **kwargs)


def cassette_option(flag: str, help: str, exists: bool = False) -> Callable[[F], F]:
    """--record or --replay CASSETTE: the model exchanges of a run, kept or answered from
    (config/cassette.py)."""
    return file_option(flag, metavar="CASSETTE", help=help, exists=exists)


def count_option(*decls: str, default: int, help: str, least: int = 1) -> Callable[[F], F]:
    """A whole number of at least `least`, with its default shown in --help."""
    kind = click.IntRange(min=least)
    return click.option(*decls, type=kind, default=default, show_default=True, help=help)


def choice_option(*decls: str, choices: list[str], help: str) -> Callable[[F], F]:
    """One of `choices`, the first by default (shown in --help)."""
    kind = click.Choice(choices)
    return click.option(*decls, type=kind, default=choices[0], show_default=True, help=help)


def renamed(old: str, dest: str, new: str, **kwargs: Any) -> Callable[[F], F]:
    """A former spelling `old` of the option `new` (whose value goes to `dest`), hidden from
    --help and still accepted, with a note on stderr that it will go."""

    def said(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is None:  # not given: the hidden spelling has no default
            return
        click.echo(f"{ctx.command_path}: {old} is now {new}; {old} will go", err=True)
        # Given, it wins over `new`'s default (click keeps a value set by a callback).
        ctx.params[dest] = value
        ctx.set_parameter_source(dest, click.ParameterSource.COMMANDLINE)

    return click.option(old, hidden=True, expose_value=False, callback=said, **kwargs)


@dataclass(frozen=True)
class RunOptions:
    """What `run` and `resume` were told: where, which broker, how long to wait, what to
    print while waiting."""

    workspace: Workspace
    broker: str | None
    timeout: float | None
    wait_for_workers: float
    as_json: bool
    quiet: bool
    log_format: str
    budget: float | None
    log_level: str | None
    record: Path | None
    replay: Path | None

    def cassettes(self, settings: Any) -> Any:
        """`settings` (GraphSettings) with --record and --replay laid over them;
        `ConfigError` when the run is not embedded (said before any worker is waited for)."""
        update = {"record": self.record, "replay": self.replay}
        if (self.record or self.replay) and settings.broker_url:
            from orchestrator.config.cassette import SHARED_BROKER
            from orchestrator.errors import ConfigError

            raise ConfigError(SHARED_BROKER)
        return settings.model_copy(update={k: v.absolute() for k, v in update.items() if v})

    def mode(self) -> Mode:
        """What to print while the run works (console.Mode); --json and --quiet exclude
        each other."""
        from orchestrator.cli import console

        if self.as_json and self.quiet:
            raise click.UsageError("--json and --quiet go one at a time")
        return console.mode(self.quiet, self.as_json, self.log_format)


# The options of `run` and `resume`, in the order --help shows them.
_RUN_OPTIONS: tuple[Callable[[F], F], ...] = (
    workspace_option,
    broker_option(),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        metavar="SECONDS",
        help="How long to wait for the verdict (default 3600); then the run stops (exit "
        "2, resumable) and what it queued does nothing.",
    ),
    wait_for_workers_option(
        5.0,
        "With a shared broker: how long to wait for a worker to answer before "
        "giving up (exit 78; nothing is claimed).",
    ),
    json_option(
        "Print one JSON document at the end (schema: docs/run-document.schema."
        "json) and nothing else on stdout."
    ),
    click.option(
        "--budget",
        type=click.FloatRange(min=0, min_open=True, max=1e6),
        metavar="USD",
        help="What the whole run may spend, across every worker (default [run] "
        "budget_usd, or no limit). A call that the rest cannot cover does not start: "
        "its ticket ends `budget`; resume with a higher --budget to finish it.",
    ),
    click.option("--quiet", "-q", is_flag=True, help="Print only the verdict line."),
    cassette_option(
        "--record",
        "Keep every model request and reply of the run in CASSETTE (a JSON "
        "file, added to if it exists), to replay offline with --replay "
        "(TICKETGRAPH_RECORD). Embedded runs.",
    ),
    cassette_option(
        "--replay",
        "Answer every model request from CASSETTE instead of a model: offline, "
        "free, identical; a request it does not hold fails its ticket "
        "(TICKETGRAPH_REPLAY). Embedded runs.",
    ),
    click.option(
        "--log-level",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
        help="Show the embedded workers' own log (Celery's) on stderr from this level "
        "(default: it goes to runs/<run>/workers.log; TICKETGRAPH_LOG_LEVEL).",
    ),
    choice_option(
        "--log-format",
        choices=["text", "json"],
        help="json: also write every trace event to stderr as one JSON line, as it "
        "happens (text: a live view on a terminal, one line per node otherwise).",
    ),
)


def run_options(f: F) -> F:
    """The options of `run` and `resume`, handed to the handler as one `RunOptions` (its
    `opts` argument)."""

    @functools.wraps(f)
    def bundled(**kwargs: Any) -> Any:
        fields = {name: kwargs.pop(name) for name in RunOptions.__dataclass_fields__}
        return f(opts=RunOptions(**fields), **kwargs)

    for option in reversed(_RUN_OPTIONS):
        bundled = option(bundled)
    return bundled
