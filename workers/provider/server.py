"""Run the scripted provider with uvicorn: in the foreground (CLI) or in a background thread.

From the command line (`--help` explains the scenario format):

    python -m workers.provider.server --scenarios harness --port 8400
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from workers import tokens
from workers.errors import ScenarioError
from workers.provider import serving
from workers.provider.app import TokenRate, create_app
from workers.provider.cassette import Cassette, is_cassette, load_cassette
from workers.provider.options import DEFAULT_HOST, DEFAULT_PORT, command
from workers.provider.scenario import Scenario, load_scenario

GRACEFUL_SHUTDOWN_S = 1.0
KEEP_ALIVE_S = 75
SHUTDOWN_TIMEOUT_S = 10.0

ScenarioSource = str | Path | Scenario | Cassette


def _scenario(source: ScenarioSource) -> Scenario | Cassette:
    """A loaded scenario (or cassette), loading it when given a path or built-in name."""
    if isinstance(source, Scenario | Cassette):
        return source
    return load_cassette(source) if is_cassette(source) else load_scenario(source)


def _server(
    scenario: Scenario | Cassette,
    host: str,
    port: int,
    log_level: str,
    rate: TokenRate | None = None,
) -> uvicorn.Server:
    """A uvicorn server for `scenario`, shared by the foreground and background runs."""
    # Build the tokenizer now if any reply will be counted (or, made line by line, may be
    # cut at max_tokens), so the first request's X-Service-Ms is not its load time; the
    # demo's replies fix their usage and are shorter in bytes than any cap: never needed.
    scripts = scenario.scripts if isinstance(scenario, Scenario) else []
    replies = [reply for script in scripts for reply in script.replies]
    if any(reply.usage is None or reply.lines is not None for reply in replies):
        tokens.encoding()
    # A bounded graceful shutdown, so a request stuck in a scripted hang cannot hold it up.
    return serving.server(
        create_app(scenario, rate),
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
    _server(_scenario(scenarios), host, port, "info", rate).run()


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
    server = _server(_scenario(scenarios), host, port, "warning", rate)
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
        scenario = _scenario(scenarios)
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
