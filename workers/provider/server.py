"""Run the scripted provider with uvicorn: in the foreground (CLI) or in a background thread.

From the command line (`--help` explains the scenario format):

    python -m workers.provider.server --scenarios harness --port 8400
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import uvicorn

from workers.errors import ScenarioError
from workers.provider import serving
from workers.provider.app import TokenRate, create_app
from workers.provider.options import DEFAULT_HOST, DEFAULT_PORT, command
from workers.provider.scenario import Scenario
from workers.provider.source import ScenarioSource, loaded

GRACEFUL_SHUTDOWN_S = 1.0
KEEP_ALIVE_S = 75
SHUTDOWN_TIMEOUT_S = 10.0


def _server(
    source: ScenarioSource,
    host: str,
    port: int,
    log_level: str,
    rate: TokenRate | None = None,
) -> uvicorn.Server:
    """A uvicorn server for `source`, shared by the foreground and background runs."""
    # A bounded graceful shutdown, so a request stuck in a scripted hang cannot hold it up.
    return serving.server(
        create_app(loaded(source), rate),
        host,
        port,
        log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # Clients pause between phases (a 10,000-ticket merge takes seconds); keep their
        # connections open across that, as hosted model APIs do.
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def serve(
    scenarios: ScenarioSource = "harness",
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    rate: TokenRate | None = None,
) -> None:
    """Serve the provider until interrupted (blocks; Ctrl-C or SIGTERM stops it)."""
    _server(scenarios, host, port, "info", rate).run()


@contextmanager
def running_provider(
    scenarios: ScenarioSource = "harness",
    host: str = DEFAULT_HOST,
    port: int = 0,
    join: bool = True,
    rate: TokenRate | None = None,
) -> Iterator[str]:
    """Run the provider on `port` (0: a free one) in a background thread; yield its URL.

    On the way out it is told to stop; `join=False` does not wait for it (up to a tick of
    uvicorn's loop, 0.1-0.2 s), for a process about to exit anyway.
    """
    server = _server(scenarios, host, port, "warning", rate)
    # Stop at once: waiting for open keep-alive connections would add a tick (0.1 s) or more
    # to every command that ran an embedded provider.
    join_s = SHUTDOWN_TIMEOUT_S if join else None
    with serving.in_thread(server, "scripted-provider", host, join_s=join_s) as url:
        yield url


def run_from_options(
    scenarios: str,
    host: str,
    port: int,
    tpm_limit: int | None = None,
    tpm_window_s: float = 60.0,
) -> int:
    """Load `scenarios` and serve them on `host`:`port` until interrupted (answering 429
    past `tpm_limit` tokens per `tpm_window_s`, if set)."""
    try:
        scenario = loaded(scenarios)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    held = (
        f"{len(scenario.scripts)} scripts"
        if isinstance(scenario, Scenario)
        else f"{len(scenario.exchanges)} recorded exchanges"
    )
    print(
        f"scripted provider: {held} from {scenario.source} at http://{host}:{port}/v1",
        flush=True,
    )
    serve(scenario, host, port, TokenRate(tpm_limit, tpm_window_s) if tpm_limit else None)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: load the scenarios and serve them until interrupted."""
    return int(
        command.main(argv, prog_name="python -m workers.provider.server", standalone_mode=False)
        or 0
    )


if __name__ == "__main__":
    sys.exit(main())
