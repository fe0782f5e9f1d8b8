"""The embedded default: a private Redis, worker processes and, if no model endpoint is
configured, the workspace's scripted provider; all started for one command and stopped after.

Order matters: the workers are forked before this process starts any thread (the provider
runs in one), and they are killed before the provider and Redis stop, so no worker sees its
model or its broker vanish mid-task.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from celery import Celery

from orchestrator.broker import worker_processes
from orchestrator.broker.app import configure
from orchestrator.broker.redis_server import RedisServer, free_port
from orchestrator.config import endpoint
from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import Workspace
from workers.settings import HarnessSettings

if TYPE_CHECKING:
    from workers.provider.cassette import Cassette
    from workers.provider.scenario import Scenario

LOOPBACK = "127.0.0.1"
# The embedded Redis is a child of this process: if it stops answering for this long, it
# died, and the run with it; nobody waits minutes for it.
OUTAGE_S = 5.0


# Threads one worker process keeps waiting on the model, where it can: past it, a reply
# wave wakes more threads than one GIL hands round cheaply. At pool 512 on 2 cores, 4
# processes of 128 against 2 of 256 took 4-5% less wall and 8% less CPU a ticket; 6 or 8
# processes were no better than 4 (BENCHMARKS.md, #21's fifteenth step), so no more than
# PROCESSES_A_CORE a core are made for it (each process is memory of its own).
MAX_THREADS = 128
PROCESSES_A_CORE = 2


def layout(pool_size: int, processes: int | None = None) -> tuple[int, int]:
    """(processes, threads each) for `pool_size` tickets in flight: `processes` if given,
    else one process per core, or up to PROCESSES_A_CORE a core where one process would
    hold over MAX_THREADS threads."""
    cores = worker_processes.cores()
    spread = min(math.ceil(pool_size / MAX_THREADS), PROCESSES_A_CORE * cores)
    procs = max(1, min(processes or max(cores, spread), pool_size))
    return procs, math.ceil(pool_size / procs)


@contextlib.contextmanager
def cluster(
    workspace: Workspace,
    settings: GraphSettings,
    llm: HarnessSettings,
    pool_size: int,
    log_file: Path | None = None,
) -> Iterator[Celery]:
    """Redis, workers and the model endpoint for one run; yields the configured app. The
    workers log to `log_file` (the run's), not to the command's stderr: what `run` prints
    is its own, one sentence for a failure; `--log-level` sends their log to stderr."""
    # Served here: the workspace's scripts or a cassette, or a proxy recording into one.
    served = not llm.base_url or settings.replay is not None or settings.record is not None
    # `run` and `resume` asked before anything was claimed; asked again for a file gone since.
    endpoint.require(workspace, settings, llm)
    port = free_port() if served else 0
    live = llm.model_copy(update={"base_url": f"http://{LOOPBACK}:{port}/v1"}) if served else llm
    # What the provider serves is loaded before the workers are forked: a tokenizer it
    # builds (~0.3 s of CPU) is theirs too, not built again by the route step or the meter.
    source = None
    if served:
        from orchestrator.config import cassette  # loaded only when a run serves a model

        source = cassette.served(workspace, settings, llm)
    redis_server = RedisServer()
    try:
        settings = settings.model_copy(update={"broker_outage_s": OUTAGE_S})
        app = configure(redis_server.start(), settings, live)
        processes, threads = layout(pool_size, settings.processes)
        level, into = settings.log_level or "WARNING", None if settings.log_level else log_file
        name = f"embedded-{os.getpid()}"
        workers = worker_processes.spawn(
            app, name, processes, threads, level, str(into) if into else None
        )
        try:
            # The provider starts while the workers connect; both are needed before the
            # first task, and neither waits for the other.
            with _provider(settings, llm, source, port if served else None):
                workers.wait_ready()
                try:
                    yield app
                finally:
                    workers.stop(graceful=False)  # all work is on disk; Redis dies next
        finally:
            workers.stop(graceful=False)
    finally:
        redis_server.stop(kill=True)  # it keeps nothing: no need to wait for its shutdown


@contextlib.contextmanager
def _provider(
    settings: GraphSettings,
    llm: HarnessSettings,
    source: Scenario | Cassette | None,
    port: int | None,
) -> Iterator[None]:
    """Serve `source` (or a recording proxy) on `port` for the duration (nothing if None)."""
    if port is None:
        yield
        return
    from orchestrator.config import cassette

    with cassette.model_endpoint(settings, llm, source, LOOPBACK, port):
        yield
