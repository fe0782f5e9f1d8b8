"""Riding out a broker outage: which errors mean "the broker is away", and how long to wait.

A Redis restart or a network blip must not cost a ticket or a verdict. Every step that
talks to Redis outside Celery's own consumer (the fan-out scripts, events, sending the next
task, the CLI's wait) goes through `retrying`: exponential backoff with full jitter, so a
fleet of workers does not reconnect in lockstep, for up to `broker_outage_s` seconds. Every
such step is idempotent (see dispatch.py), so doing one again after a lost reply is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

T = TypeVar("T")

log = logging.getLogger(__name__)

# redis-py's ConnectionError covers refused, reset and "Redis is loading its data" (after a
# restart); kombu raises OperationalError once its own publish retries are spent.
BROKER_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OperationalError,
    ConnectionError,
)
FIRST_WAIT_S = 0.2
LONGEST_WAIT_S = 5.0


def retrying(window_s: float, what: str) -> Retrying:
    """A retry policy for broker calls: backoff up to `window_s`, then the last error."""
    return Retrying(
        retry=retry_if_exception_type(BROKER_ERRORS),
        wait=wait_random_exponential(multiplier=FIRST_WAIT_S, max=LONGEST_WAIT_S),
        stop=stop_after_delay(window_s),
        before_sleep=_warn(what),
        reraise=True,
    )


def call(fn: Callable[[], T], window_s: float, what: str) -> T:
    """`fn()`, retried through a broker outage of up to `window_s` seconds."""
    try:
        return fn()  # the broker nearly always answers: build the retry policy only when not
    except BROKER_ERRORS as exc:
        if window_s <= 0:
            raise
        log.warning("broker unreachable while %s (%s); retrying for %.0f s", what, exc, window_s)
    return retrying(window_s, what)(fn)


def _warn(what: str) -> Callable[[RetryCallState], None]:
    def warn(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "broker unreachable while %s (%s); retrying for %.0f s so far",
            what,
            exc,
            state.seconds_since_start,
        )

    return warn
