"""`ticketgraph web`: the web view of a workspace's runs and tickets, behind a login, on
loopback (orchestrator/web/). Served by uvicorn in this process."""

from __future__ import annotations

import socket
import sys
from typing import TYPE_CHECKING

import click

from orchestrator.cli.listening import listening_on
from orchestrator.cli.options import broker_option, listen_options, workspace_option
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator.config.environment import GraphSettings
    from orchestrator.config.workspace import Workspace
    from orchestrator.web.login import Login

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 8600


@click.command("web")
@workspace_option
@listen_options(DEFAULT_ADDRESS, DEFAULT_PORT)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name the pages are served under besides the address, localhost and "
    "127.0.0.1 (repeat; e.g. the name a TLS proxy forwards). Other Host headers get 400.",
)
@broker_option("TICKETGRAPH_BROKER_URL (cancel tells the workers through it)")
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve without a login, read-only: pages and /metrics, no action.",
)
def command(
    workspace: Workspace,
    address: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    broker: str | None,
    no_auth: bool,
) -> int:
    """Serve a web view of the workspace's runs and tickets (runs, a run, a ticket, /metrics).

    Pages: / (runs, newest first), /runs/RUN_ID (steps, tickets; updates itself while the
    run works), /runs/RUN_ID/tickets/TICKET (its text, reply, gate rounds, agent runs, tool
    calls, decisions) and /metrics (Prometheus). Signed-in users can approve or reject a
    waiting call, cancel a run and requeue its tickets: the same code as the CLI's commands,
    recorded in the run's trace with the user's name.

    It listens on 127.0.0.1:8600 and asks for HTTP basic auth on every path: set
    TICKETGRAPH_WEB_USER and TICKETGRAPH_WEB_PASSWORD in the environment. Without them it
    refuses to start (exit 78) unless --no-auth, which serves every page read-only to
    whoever reaches the port. Flower (`ticketgraph flower`) stays the view of workers and
    Celery tasks. SIGTERM or Ctrl-C stops it (exit 0).
    """
    import uvicorn

    from orchestrator.web.app import application

    settings = _settings(workspace, broker)
    accepted = _login(settings, no_auth, f"{address}:{port}")
    with listening_on(address, port):
        listening = _listen(address, port)
    hosts = _hosts(address, allowed_hosts)
    app = application(
        workspace,
        read_only=no_auth,
        login_=accepted,
        broker_url=settings.broker_url,
        hosts=hosts,
    )
    print(
        f"ticketgraph web: serving {workspace.root.resolve()} on http://{address}:{port}/",
        flush=True,
    )
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[listening])
    return ExitCode.ALL_PASS


def _settings(workspace: Workspace, broker: str | None) -> GraphSettings:
    """The graph's settings for the web view, once the workspace is known to be one."""
    from orchestrator.config import environment

    workspace.require()
    return environment.settings(broker, None)


def _login(settings: GraphSettings, no_auth: bool, where: str) -> Login | None:
    """The login every page asks for (TICKETGRAPH_WEB_USER and _PASSWORD; `ConfigError`
    without them); none with --no-auth, which is said on stderr."""
    from orchestrator.web import login

    if no_auth:
        _say(f"no login (--no-auth): read-only, whoever reaches {where} sees every ticket")
        return None
    password = settings.web_password and settings.web_password.get_secret_value()
    return login.required(settings.web_user, password)


def _say(line: str) -> None:
    """A line for the operator on stderr (stdout says where the pages are)."""
    print(f"ticketgraph web: {line}", file=sys.stderr)


def _hosts(address: str, allowed: tuple[str, ...]) -> list[str] | None:
    """The Host header names to serve (None: any, said on stderr): the address and
    loopback's names, so a page elsewhere whose name was rebound to this address gets 400,
    not the tickets."""
    if address in ("0.0.0.0", "::") and not allowed:
        _say(
            f"listening on {address}, any Host header is served; name the host with "
            "--allowed-host to refuse the others"
        )
        return None
    return sorted({address, "localhost", "127.0.0.1", *allowed})


def _listen(address: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a taken port is this command's error."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
