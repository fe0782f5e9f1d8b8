"""The long-running commands a deployment starts: `worker` (serve runs from a shared
broker), declared here; `flower` (cli/flower.py) and `web` (cli/web.py), each in a module
with its server's helpers; and the scripted `provider`, declared with the provider in
workers/ (which never imports orchestrator/)."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli import flower, web
from orchestrator.cli.loading import loading
from orchestrator.cli.options import broker_option, count_option, renamed
from orchestrator.errors import ConfigError
from workers.provider.options import command as provider


@click.command()
@broker_option(help_default="TICKETGRAPH_BROKER_URL")
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(min=1),
    help="Worker processes (default: one per core this process may use, as its CPU "
    "affinity and its cgroup's CPU quota allow).",
)
@count_option("--threads", "-t", default=8, help="Threads per process.")
@click.option("--hostname", help="Node name prefix, e.g. worker1 (default ticketgraph).")
# The former short spelling: -n is `runs --limit` (as in `head -n`), so here it goes.
@renamed("-n", "hostname", "--hostname")
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
    with loading():
        from orchestrator.broker import worker_processes
        from orchestrator.broker.app import connect
        from orchestrator.config import declarations
        from orchestrator.config.workspace import Workspace
        from workers.settings import HarnessSettings, load

    app = connect(broker)
    app.conf.worker_send_task_events = task_events
    if not load(HarnessSettings, "LLM_").base_url:
        raise ConfigError(
            "set LLM_BASE_URL (the model endpoint; for the demo, "
            "`ticketgraph provider --scenarios scenarios/demo.yaml` serves one)"
        )
    for folder in workspaces:  # before any process is forked: each inherits the modules
        declarations.preload(Workspace(folder))
    name = (hostname or "ticketgraph").split("@", 1)[0]
    count = processes or worker_processes.cores()
    return worker_processes.serve(app, name, count, threads, loglevel.upper())


COMMANDS = (worker, flower.command, web.command, provider)
