"""The graph's settings as a command reads them: the environment and its flags, the model
endpoint's settings checked too, before anything is claimed."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.config.environment import GraphSettings


def checked(
    broker: str | None,
    timeout: float | None,
    pool_size: int | None = None,
    stop_after: str | None = None,
    budget: float | None = None,
    log_level: str | None = None,
) -> GraphSettings:
    """The graph's settings (environment and flags), the model endpoint's checked too,
    before anything is claimed."""
    from orchestrator.config import environment
    from workers.settings import HarnessSettings, load

    load(HarnessSettings, "LLM_")
    level = log_level.upper() if log_level else None
    return environment.settings(broker, timeout, pool_size, stop_after, budget, level)
