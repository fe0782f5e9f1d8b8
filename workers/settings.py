"""Settings of the harness, read from the environment once and passed in explicitly."""

from __future__ import annotations

import difflib
import os
from typing import Literal, TypeVar

import httpx
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers.pricing import PriceTable


class HarnessSettings(BaseSettings):
    """Where the model lives and how long to wait for it."""

    # A bad value is never printed by pydantic's own message (it may be the API key); our
    # messages (`describe`) show the values that are not secrets.
    model_config = SettingsConfigDict(env_prefix="LLM_", extra="ignore", hide_input_in_errors=True)

    api: Literal["openai", "anthropic"] = Field(
        default="openai", description="openai: chat completions; anthropic: Messages"
    )
    base_url: str | None = Field(
        default=None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8400/v1"
    )
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    max_retries: int = Field(
        default=2,
        ge=0,
        description="retries of 408/409/429, 5xx, refused/reset connections and timeouts",
    )
    retry_max_s: float = Field(
        default=60.0, ge=0, description="retries stop once this much time has passed"
    )
    prices: PriceTable = PriceTable()
    # Override the workspace's [harness] settings for every role (router and workers).
    model: str | None = Field(default=None, description="model name for every role")
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    token_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # Caps on the endpoint shared by every worker of the graph
    # (orchestrator/coordination/ratecap.py)
    max_inflight: int | None = Field(default=None, ge=1, description="requests in flight")
    max_tpm: int | None = Field(default=None, ge=1, description="tokens per minute")
    tpm_window_s: float = Field(
        default=60.0, gt=0, description="the window LLM_MAX_TPM counts over"
    )

    @field_validator("api_key")
    @classmethod
    def _sendable(cls, key: str | None) -> str | None:
        # It goes in a header as it is: httpx would refuse it on the first request.
        if key is not None and not (key.isascii() and key.isprintable()):
            raise ValueError(
                "holds a character an HTTP header cannot carry (a placeholder such as "
                "'sk-…', a space or a line break from the copy?): set the key itself"
            )
        return key

    @field_validator("base_url")
    @classmethod
    def _an_http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = httpx.URL(url)  # the client's own parser; its error would quote the URL
        except httpx.InvalidURL:
            raise ValueError(
                "is not a URL the client can send to: its port must be a number, and a '/', "
                "'?', '#' or '@' in its user name or password percent-encoded (%2F, %3F, %23, "
                "%40)"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.host:
            raise ValueError(
                "must be an http:// or https:// URL of the model API, "
                "e.g. https://api.openai.com/v1 or http://127.0.0.1:8400/v1"
            )
        return url


S = TypeVar("S", bound=BaseSettings)
SECRETS = frozenset({"api_key"})  # fields whose value no message prints


class SettingsError(ValueError):
    """A setting from the environment (or a flag) is not valid: one sentence naming it."""


# Prefixes only this project uses: a variable under one that names no setting is a typo.
OWN_PREFIXES = ("TICKETGRAPH_",)


def load(cls: type[S], prefix: str) -> S:
    """`cls()` from the environment; `SettingsError` naming each bad variable and its value,
    or a misspelt variable under a prefix of ours with the closest real one."""
    if prefix in OWN_PREFIXES:
        _refuse_unknown(cls, prefix)
    try:
        return cls()
    except ValidationError as exc:
        raise SettingsError(describe(exc, prefix, cls)) from None


def variables(cls: type[BaseSettings], prefix: str) -> list[str]:
    """Every environment variable that sets a field of `cls`."""
    names = []
    for name, field in cls.model_fields.items():
        choices = getattr(field.validation_alias, "choices", None)
        names += [c for c in choices if isinstance(c, str)] if choices else [f"{prefix}{name}"]
    return [n.upper() for n in names]


def _refuse_unknown(cls: type[BaseSettings], prefix: str) -> None:
    known = variables(cls, prefix)
    for name in sorted(os.environ):
        if name.startswith(prefix) and name not in known:
            ours = {k.removeprefix(prefix): k for k in known if k.startswith(prefix)}
            close = difflib.get_close_matches(name.removeprefix(prefix), ours, n=1, cutoff=0.6)
            hint = f"; did you mean {ours[close[0]]}?" if close else f" ({', '.join(known)})"
            raise SettingsError(f"{name} is not a setting{hint}")


def describe(exc: ValidationError, prefix: str, cls: type[BaseSettings] | None = None) -> str:
    """A validation error as one sentence: `LLM_READ_TIMEOUT_S='abc': Input should be ...`,
    naming the variable the user set (`POOL_SIZE`, not the `TICKETGRAPH_POOL_SIZE` it is
    an alias of)."""
    parts = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if not error["loc"]:  # a rule over several variables: its message names them
            parts.append(message)
            continue
        field = str(error["loc"][0])
        name = field if field.isupper() else f"{prefix}{field}".upper()
        name = _written(name, cls)
        value = error.get("input")
        value = masked(value) if isinstance(value, str) else value  # never print a secret
        value = None if field in SECRETS else value
        shown = f"={value!r}" if isinstance(value, str | int | float) else ""
        parts.append(f"{name}{shown}: {message}")
    return "; ".join(parts)


def masked(url: str) -> str:
    """`url` with the password of its credentials, if any, shown as `**`: a message must not
    print a secret (kombu's `maybe_sanitize_url`, which the broker's URL goes through, drops
    the query and fails on a password holding '?')."""
    scheme, sep, rest = url.partition("://")
    # Up to the path: a raw '@', '?' or '#' in a password is masked with it (over-masking a
    # query without a path is the safe side), and the last '@' ends the credentials.
    end = rest.find("/") if "/" in rest else len(rest)
    userinfo, at, host = rest[:end].rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:**@{host}{rest[end:]}"


def _written(name: str, cls: type[BaseSettings] | None) -> str:
    """Of the variables that set the same field as `name`, the one the environment holds."""
    if cls is None or name in os.environ:
        return name
    for field in cls.model_fields.values():
        choices = getattr(field.validation_alias, "choices", None) or []
        if name in choices:
            return next((c for c in choices if isinstance(c, str) and c in os.environ), name)
    return name
