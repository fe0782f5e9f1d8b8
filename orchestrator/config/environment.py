"""Settings of the graph that come from the environment (one class, passed in explicitly)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.config.broker_url import broker_url_problem, shown
from orchestrator.coordination.leases import DEFAULT_LEASE_S
from orchestrator.errors import ConfigError
from orchestrator.run.outline import STOP_POINTS
from workers.settings import SettingsError, load

# The steps a run may be asked to stop after (the plan's rows that say so).
StopAfter = Literal[STOP_POINTS]  # type: ignore[valid-type]


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
    budget_usd: float | None = Field(
        default=None, gt=0, le=1e6, description="what the whole run may spend ([run] budget_usd)"
    )
    # Per task: at the soft limit the task's agent is cancelled (its ticket stops with reason
    # `time_limit`); at the hard limit a task that still runs is recorded so and its worker
    # process is replaced.
    soft_time_limit_s: int = Field(default=600, ge=1)
    time_limit_s: int = Field(default=660, ge=1)
    # A message its worker has not acknowledged comes back to the queue after this long
    # without a heartbeat: a worker that died loses its tickets for at most this plus the
    # sweep interval. Live workers refresh every message they hold every third of it.
    visibility_timeout_s: int = Field(default=30, ge=3)
    restore_interval_s: int = Field(
        default=5, ge=1, description="how often workers look for messages to bring back"
    )
    broker_outage_s: float = Field(
        default=120,
        ge=0,
        description="how long tasks and the waiting CLI retry a broker that went away",
    )
    lease_s: float = Field(
        default=DEFAULT_LEASE_S,
        ge=1,
        description="how long a dead worker's budget hold or cap slot outlives it (its "
        "holder renews every quarter of it)",
    )
    commit_window_ms: float = Field(
        default=0,
        ge=0,
        le=1000,
        description="how long a worker process gathers durable saves into one flush to disk "
        "(workers/commit.py; 0: the saves that arrive while a flush runs)",
    )
    processes: int | None = Field(
        default=None,
        ge=1,
        description="embedded worker processes (default: one per core, up to two a core to "
        "hold at most 128 threads each)",
    )
    run_timeout_s: float = Field(
        default=3600, gt=0, description="how long `run` waits for a verdict"
    )
    # Record every model exchange of an embedded run into this cassette, or answer every
    # model request from it (orchestrator/config/cassette.py; --record, --replay).
    record: Path | None = None
    replay: Path | None = None
    # An embedded run's workers log to runs/<run>/workers.log; with a level, to stderr.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None
    # `ticketgraph web`'s login (HTTP basic auth); without it the web view refuses to start.
    web_user: str | None = None
    web_password: SecretStr | None = None

    @field_validator("broker_url")
    @classmethod
    def _a_redis_url(cls, url: str | None) -> str | None:
        if url is not None and (problem := broker_url_problem(url)) is not None:
            raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _soft_below_hard(self) -> GraphSettings:
        if not self.soft_time_limit_s < self.time_limit_s:
            raise ValueError(
                f"TICKETGRAPH_SOFT_TIME_LIMIT_S ({self.soft_time_limit_s}) must be less than "
                f"TICKETGRAPH_TIME_LIMIT_S ({self.time_limit_s}): the soft limit cancels the "
                "agent, the hard one replaces its process"
            )
        return self

    @property
    def heartbeat_s(self) -> float:
        """How often a worker refreshes the messages it holds: three beats per timeout."""
        return self.visibility_timeout_s / 3


def settings(
    broker: str | None = None,
    timeout: float | None = None,
    pool_size: int | None = None,
    stop_after: str | None = None,
    budget_usd: float | None = None,
    log_level: str | None = None,
) -> GraphSettings:
    """The graph's settings from the environment, with the command's flags laid over them;
    `SettingsError`, one sentence naming the variable or the flag, for a value that cannot
    work."""
    loaded = load(GraphSettings, "TICKETGRAPH_")
    if broker is not None and (problem := broker_url_problem(broker)) is not None:
        raise SettingsError(f"--broker {shown(broker)!r}: {problem}")
    flags = {"broker_url": broker, "run_timeout_s": timeout, "pool_size": pool_size}
    flags["stop_after"], flags["budget_usd"], flags["log_level"] = stop_after, budget_usd, log_level
    return loaded.model_copy(update={k: v for k, v in flags.items() if v is not None})


def broker_url(flag: str | None) -> str:
    """--broker, else TICKETGRAPH_BROKER_URL; `ConfigError` if neither is set (a command
    that needs a shared broker: worker, flower)."""
    url = settings(broker=flag).broker_url
    if not url:
        raise ConfigError(
            "set TICKETGRAPH_BROKER_URL (the broker your `ticketgraph worker` processes use) "
            "or pass --broker"
        )
    return url
