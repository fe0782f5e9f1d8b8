"""The model a run will talk to, found before anything is claimed.

An embedded run needs LLM_BASE_URL, or the workspace's scripted replies (scenarios/demo.yaml,
served by the scripted provider) to try it offline; an LLM_BASE_URL on this machine that
turns connections away is a model server that is not started. Either is a configuration
error (exit 78) for `run`, `resume` and `check` alike, said in one sentence, with inbox/ left
as it was. A run on a shared broker is answered by its workers, which need their own
LLM_BASE_URL (`ticketgraph worker` checks it), so nothing is asked of this process's.
"""

from __future__ import annotations

from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import Workspace
from orchestrator.errors import ConfigError
from workers.model.client import refused
from workers.settings import HarnessSettings, masked


def require(workspace: Workspace, settings: GraphSettings, llm: HarnessSettings) -> str:
    """Where the run's model requests will go, in a few words; `ConfigError` naming the
    setting and the way to try offline when no model is reachable by configuration."""
    if settings.replay is not None or settings.record is not None:
        from orchestrator.config import cassette

        return cassette.require(workspace, settings, llm)
    if settings.broker_url:
        return "the workers' own LLM_BASE_URL (a run on a shared broker)"
    offline = (
        f"run `ticketgraph scenarios init` to write scripted replies for the tickets in "
        f"inbox/ to {workspace.scenarios} and try it offline"
    )
    if llm.base_url:
        shown = masked(llm.base_url)
        if (why := refused(llm)) is not None:
            raise ConfigError(
                f"no model answers at LLM_BASE_URL={shown} ({why}): start the model's "
                f"server, or unset LLM_BASE_URL and {offline}"
            )
        return f"{shown} ({llm.api} API)"
    if workspace.scenarios.exists():
        return f"none set: `run` serves the scripted replies of {workspace.scenarios.name}"
    raise ConfigError(
        "no model to run with: set LLM_BASE_URL to your model's OpenAI-compatible endpoint "
        f"(e.g. http://127.0.0.1:8080/v1), or {offline}"
    )
