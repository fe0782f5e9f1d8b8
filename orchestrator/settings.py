"""Settings of the graph that come from the environment (one class, passed in explicitly)."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

StopAfter = Literal["route", "merge"]


class GraphSettings(BaseSettings):
    """Broker, limits and per-run overrides; unset values fall back to the workspace config."""

    model_config = SettingsConfigDict(env_prefix="TICKETGRAPH_", extra="ignore")

    broker_url: str | None = Field(
        default=None, description="Redis URL; unset means an embedded Redis for one run"
    )
    pool_size: int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("TICKETGRAPH_POOL_SIZE", "POOL_SIZE")
    )
    stop_after: StopAfter | None = Field(
        default=None, validation_alias=AliasChoices("TICKETGRAPH_STOP_AFTER", "STOP_AFTER")
    )
    # A task that outlives the visibility timeout is delivered again while still running, so
    # the hard limit stays below it.
    soft_time_limit_s: int = 600
    time_limit_s: int = 660
    visibility_timeout_s: int = 900
    processes: int | None = Field(
        default=None, ge=1, description="embedded worker processes (default: one per core)"
    )
    run_timeout_s: float = Field(default=3600, description="how long `run` waits for a verdict")

    @model_validator(mode="after")
    def _limits_below_visibility(self) -> GraphSettings:
        if not self.soft_time_limit_s < self.time_limit_s < self.visibility_timeout_s:
            raise ValueError(
                "need soft_time_limit_s < time_limit_s < visibility_timeout_s, got "
                f"{self.soft_time_limit_s}, {self.time_limit_s}, {self.visibility_timeout_s}"
            )
        return self
