"""A run's events for the command that waits on it, and the marker of a live submission.

The waiting `run` or `resume` reads its run's events with a blocking pop (no polling); a
task that ends a node or the run pushes one. The marker tells the waiting command whether
the broker still has the submission, after an outage and every second besides (a Redis
restarted without its data, flushed or evicting has lost it).
"""

from __future__ import annotations

import json
from typing import Any

import redis

from orchestrator.coordination import keys


def mark_submitted(r: redis.Redis, run_id: str, attempt: str) -> None:
    """Note that this submission of the run is live on this broker."""
    r.set(keys.submitted(run_id, attempt), "1", ex=keys.RUN_TTL_S)


def still_submitted(r: redis.Redis, run_id: str, attempt: str) -> bool:
    """False if the broker lost the submission (restarted without persistence)."""
    return bool(r.exists(keys.submitted(run_id, attempt)))


def publish(r: redis.Redis, run_id: str, event: str, **data: Any) -> None:
    """Tell the CLI waiting on this run that something happened (a node ended, the run ended)."""
    key = keys.events(run_id)
    with r.pipeline() as pipe:
        pipe.rpush(key, json.dumps({"event": event, **data}))
        pipe.expire(key, keys.RUN_TTL_S)
        pipe.execute()


def next_event(r: redis.Redis, run_id: str, timeout_s: float) -> dict[str, Any] | None:
    """The run's next event, waiting up to `timeout_s` (a blocking read, no polling)."""
    item = r.blpop([keys.events(run_id)], timeout=timeout_s)
    return None if item is None else json.loads(item[1])
