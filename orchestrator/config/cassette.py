"""A run's model endpoint when it records or replays a cassette (`run --record/--replay`).

Replay serves the cassette with the scripted provider (workers/provider/cassette.py) the way
an embedded run serves scenarios/demo.yaml, whatever LLM_BASE_URL says: offline, free and
the same answers every time. Record puts a proxy in front of the run's model (LLM_BASE_URL,
or the workspace's scripts when none is set) that keeps every exchange. Both are an embedded
run's: on a shared broker the workers talk to their own LLM_BASE_URL, so they are pointed at
`ticketgraph provider --scenarios CASSETTE` (or `--record CASSETTE --upstream URL`) instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import Workspace
from orchestrator.errors import ConfigError
from orchestrator.process import free_port
from orchestrator.run import ids
from orchestrator.run.store import ROUTER
from workers.errors import ScenarioError
from workers.settings import HarnessSettings, masked

if TYPE_CHECKING:
    from workers.provider.cassette import Cassette
    from workers.provider.scenario import Scenario

SHARED_BROKER = (
    "--record and --replay serve an embedded run's model; with a shared broker the workers "
    "use their own LLM_BASE_URL: point it at `ticketgraph provider --scenarios CASSETTE` to "
    "replay, or `ticketgraph provider --record CASSETTE --upstream URL` to record"
)


def require(workspace: Workspace, settings: GraphSettings, llm: HarnessSettings) -> str:
    """Where a recording or replaying run's requests go, in a few words; `ConfigError` when
    the cassette cannot be read or written, or the run is not embedded."""
    from workers.model.client import refused
    from workers.provider.cassette import load_cassette

    if settings.broker_url:
        raise ConfigError(SHARED_BROKER)
    if settings.record is not None and settings.replay is not None:
        raise ConfigError("--record and --replay go one at a time")
    if settings.replay is not None:
        try:
            held = load_cassette(settings.replay)
        except ScenarioError as exc:
            raise ConfigError(f"{exc} (record one with `ticketgraph run --record`)") from exc
        return f"the cassette {settings.replay} ({len(held.exchanges)} exchanges, no model)"
    assert settings.record is not None
    if not settings.record.parent.is_dir():
        raise ConfigError(f"{settings.record.parent} is not a folder: the cassette goes there")
    try:
        load_cassette(settings.record, missing_ok=True)
    except ScenarioError as exc:
        raise ConfigError(f"{exc}: record into a new file") from exc
    if llm.base_url:
        if (why := refused(llm)) is not None:
            raise ConfigError(f"no model answers at LLM_BASE_URL={masked(llm.base_url)} ({why})")
        return f"{masked(llm.base_url)}, recorded into {settings.record}"
    if not workspace.scenarios.exists():
        raise ConfigError("nothing to record: set LLM_BASE_URL to the model to record")
    return f"the scripted replies of {workspace.scenarios.name}, recorded into {settings.record}"


def served(
    workspace: Workspace, settings: GraphSettings, llm: HarnessSettings
) -> Scenario | Cassette | None:
    """What an embedded run's own provider serves, loaded (with the tokenizer, if its
    replies are counted: workers/provider/source.py): the cassette it replays, else the
    workspace's scripts; None when it records from LLM_BASE_URL."""
    from workers.provider.cassette import load_cassette
    from workers.provider.source import loaded

    if settings.replay is not None:
        return loaded(load_cassette(settings.replay))
    if settings.record is not None and llm.base_url:
        return None
    return loaded(workspace.scenarios)


@contextlib.contextmanager
def model_endpoint(
    settings: GraphSettings,
    llm: HarnessSettings,
    source: Scenario | Cassette | None,
    host: str,
    port: int,
) -> Iterator[None]:
    """Serve the run's model on `host`:`port` for the duration: `source` (`served`: the
    cassette it replays, or the workspace's scripts), or a proxy recording into a cassette
    what LLM_BASE_URL (or else `source`) answers."""
    from workers.provider import running_provider

    # The command ends right after: the scripted provider is told to stop, not waited for.
    if settings.record is None:
        assert source is not None
        with running_provider(source, host, port, join=False):
            yield
        return
    with contextlib.ExitStack() as stack:
        upstream = llm.base_url
        if not upstream:
            assert source is not None
            scripts = running_provider(source, host, free_port(), join=False)
            upstream = stack.enter_context(scripts)
        yield from _recording(settings, upstream, host, port)


def _recording(settings: GraphSettings, upstream: str, host: str, port: int) -> Iterator[None]:
    from workers.provider.recorder import recording_proxy

    assert settings.record is not None
    with recording_proxy(settings.record, upstream, host, port):
        yield


def miss_sentence(error: str, state_path: Path) -> str:
    """A cassette miss said with the ticket and the step whose request it was (the agent
    state's name, `<ticket>.<step>.json`), instead of the endpoint's address."""
    ticket, step = ids.agent_of(state_path)
    from workers.provider.cassette import MISS

    said = error[error.find("the cassette ") :] if MISS in error else error
    who = "the routing step" if ticket == ROUTER else f"ticket {ticket}, step {step}"
    return f"{who}: {said}"
