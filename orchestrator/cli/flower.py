"""`ticketgraph flower`: Flower for the broker the workers use, behind a login, on loopback.

Flower 2.2.0 runs in this process as Flower's own `celery flower` command, on the graph's
Celery app (the same configuration and tasks as `ticketgraph worker`). What this command adds
is what Flower leaves to its caller:

- the broker comes from --broker or TICKETGRAPH_BROKER_URL, never from Celery's default
  (amqp://localhost) nor from a stray CELERY_BROKER_URL;
- it listens on 127.0.0.1 unless told otherwise (Flower's default is every interface);
- it refuses to start without a login unless --no-auth says so. The logins are handed to
  Flower in this process, so no password stands on a command line `ps` shows.

Flower's basic auth covers its pages and /api; /healthcheck and /metrics stay open (their
handlers never ask who is calling).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from orchestrator.cli.listening import listening_on
from orchestrator.cli.options import broker_option, listen_options
from orchestrator.errors import ConfigError
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from celery import Celery

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 5555


@click.command("flower")
@broker_option(help_default="TICKETGRAPH_BROKER_URL, which keeps its password out of ps")
@listen_options(DEFAULT_ADDRESS, DEFAULT_PORT)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without a login, ignoring FLOWER_USER/FLOWER_PASSWORD; /api then answers 401 "
    "unless FLOWER_UNAUTHENTICATED_API=true.",
)
def command(broker: str | None, address: str, port: int, no_auth: bool) -> int:
    """Watch workers and tasks in Flower (web UI, HTTP API, Prometheus metrics).

    Start Flower, Celery's web monitor, for the broker your workers use (--broker or
    TICKETGRAPH_BROKER_URL), with the graph's tasks registered. It listens on 127.0.0.1:5555
    by default and asks for HTTP basic auth on its pages and its HTTP API (/api/workers,
    /api/tasks): set FLOWER_USER and FLOWER_PASSWORD in the environment (or Flower's own
    FLOWER_BASIC_AUTH=user:password, several separated by commas). Without a login it
    refuses to start (exit 78) unless --no-auth. /healthcheck and the Prometheus metrics at
    /metrics need no login: keep the port reachable only by those who may read them. Other
    FLOWER_* settings (FLOWER_PERSISTENT, FLOWER_MAX_TASKS, ...) work as in `celery flower`.
    SIGTERM or Ctrl-C stops it (exit 0).
    """
    accepted = [] if no_auth else logins(os.environ)
    celery_app = _app(broker)
    if no_auth:
        print(
            f"ticketgraph flower: no login (--no-auth): whoever reaches {address}:{port} "
            "sees every worker and task",
            file=sys.stderr,
        )
    with listening_on(address, port):
        _serve(celery_app, address, port, accepted)
    return ExitCode.ALL_PASS


def logins(environ: Mapping[str, str]) -> list[str]:
    """The `user:password` logins Flower is to accept, from FLOWER_USER and FLOWER_PASSWORD
    and from FLOWER_BASIC_AUTH; `ConfigError` (never quoting a password) if there is none or
    one is malformed."""
    found = [*_user_and_password(environ), *_basic_auth(environ)]
    if not found:
        raise ConfigError(
            "Flower needs a login: set FLOWER_USER and FLOWER_PASSWORD (or "
            "FLOWER_BASIC_AUTH=user:password), or pass --no-auth to serve it without one"
        )
    return found


def _user_and_password(environ: Mapping[str, str]) -> list[str]:
    user, password = environ.get("FLOWER_USER", ""), environ.get("FLOWER_PASSWORD", "")
    if not (user or password):
        return []
    if not (user and password):
        unset = "FLOWER_PASSWORD" if user else "FLOWER_USER"
        raise ConfigError(f"{unset} is not set (FLOWER_USER and FLOWER_PASSWORD go together)")
    if ":" in user:
        raise ConfigError(f"FLOWER_USER={user!r} holds a ':', which basic auth cannot carry")
    # Taken whole: a password may hold any character, commas included.
    return [f"{user}:{password}"]


def _basic_auth(environ: Mapping[str, str]) -> list[str]:
    # Flower's own variable, read as Flower reads it: logins separated by commas.
    pairs = [p for p in environ.get("FLOWER_BASIC_AUTH", "").split(",") if p]
    for pair in pairs:
        user, _, password = pair.partition(":")
        if not (user and password):
            raise ConfigError(
                "FLOWER_BASIC_AUTH must be user:password (several separated by commas)"
            )
    return pairs


def _app(broker: str | None) -> Celery:
    """The graph's Celery app, configured as `ticketgraph worker` configures it."""
    from orchestrator.broker.app import connect
    from orchestrator.config import environment
    from orchestrator.plan import tasks  # noqa: F401 — registers the graph's tasks on the app

    url = environment.broker_url(broker)
    celery_app = connect(url)
    # Flower's broker page and /api/queues/length know a broker by its URL's scheme, and
    # the workers' transport (transport.py, a publishing speed-up) names URLs after its
    # class; Flower hardly publishes, so kombu's stock Redis transport serves it.
    celery_app.conf.update(broker_url=url, broker_transport=None)
    return celery_app


def _serve(celery_app: Celery, address: str, port: int, accepted: list[str]) -> None:
    """Flower's `celery flower` command in this process, on `celery_app`, until it stops."""
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery as celery_command
    from flower.command import flower as flower_command
    from flower.options import options

    os.environ.pop("FLOWER_BASIC_AUTH", None)  # the app's configure() dropped CELERY_BROKER_*
    # Set here rather than through --basic-auth or FLOWER_BASIC_AUTH: Flower splits those at
    # commas (a password may hold one), and it would re-read the variable over this list.
    options.basic_auth = accepted
    # Flower's command reads its app from the `celery` command's context, as `celery -A`
    # leaves it; building that context here skips the `celery` command's own parsing, which
    # reads generic variables (APP, BROKER_URL) that could replace the app or the broker.
    parent = click.Context(
        celery_command,
        info_name="celery",
        obj=CLIContext(app=celery_app, no_color=True, workdir=None),
    )
    argv = [f"--address={address}", f"--port={port}"]
    with flower_command.make_context("flower", argv, parent=parent) as ctx:
        flower_command.invoke(ctx)
