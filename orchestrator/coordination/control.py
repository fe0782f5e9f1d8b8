"""Cancel, delivered live to every worker process that runs part of a run.

The durable cancel is a file in the run folder (run/cancels.py): it stops every task and
model request that starts after it. What already runs — a model request waiting for a slow
reply, a slow tool — is reached through the broker: `ticketgraph cancel` publishes one
message on a Redis channel every worker process listens on; each process sets the cancel
token of every step of that run it runs (which cuts their requests' connections and wakes
their tools, workers/model/abortable.py), waits for those steps to record their stop, and answers
with how many it stopped. The command waits
for as many answers as the channel had listeners, so when it returns, what ran has been
abandoned.

A process that was away from the broker when the message went misses it; its running steps
still stop before their next model request (the file), only a request already waiting runs
to its end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from orchestrator.coordination import keys
from workers.cancel import CancelToken

log = logging.getLogger(__name__)

ACK_TTL_S = 60
# How long a process waits for the steps it stopped to end (record their stop) before it
# answers: a step stops within milliseconds of its token being set.
ENDED_WAIT_S = 2.0

_lock = threading.Lock()
_ended = threading.Condition(_lock)
_running: dict[str, dict[int, tuple[str | None, CancelToken]]] = {}  # run -> steps
_stop = threading.Event()
_started_in: set[int] = set()


@contextlib.contextmanager
def running(run_id: str, ticket: str | None, token: CancelToken) -> Iterator[None]:
    """While the block runs, a cancel of the run (or of `ticket`) sets `token`."""
    with _lock:
        _running.setdefault(run_id, {})[id(token)] = (ticket, token)
    try:
        yield
    finally:
        with _ended:
            steps = _running.get(run_id, {})
            steps.pop(id(token), None)
            if not steps:
                _running.pop(run_id, None)
            _ended.notify_all()


def cancel_here(
    run_id: str, tickets: list[str] | None, why: str, wait_s: float = ENDED_WAIT_S
) -> tuple[int, int]:
    """Set the token of every step of the run (or of `tickets`) this process runs, then wait
    up to `wait_s` for them to end; (steps stopped, of them ended)."""
    with _lock:
        steps = list(_running.get(run_id, {}).values())
    hit = [t for ticket, t in steps if tickets is None or ticket in tickets]
    for token in hit:
        token.cancel(why)  # cuts the request's connection in this thread: done on return
    deadline = time.monotonic() + wait_s
    with _ended:
        while (left := deadline - time.monotonic()) > 0 and _still_running(run_id, hit):
            _ended.wait(left)
        return len(hit), len(hit) - _still_running(run_id, hit)


def _still_running(run_id: str, tokens: list[CancelToken]) -> int:
    steps = _running.get(run_id, {})
    return sum(id(t) in steps for t in tokens)


# --- the listening side: one thread per worker process ---------------------------------------


def start(broker_url: str) -> None:
    """Listen for cancels in this worker process (once; a reconnect changes nothing)."""
    if os.getpid() in _started_in:
        return
    _started_in.add(os.getpid())
    _stop.clear()
    thread = threading.Thread(target=_listen, args=(broker_url,), name="tg-control", daemon=True)
    thread.start()


def stop() -> None:
    """Stop listening (the worker is shutting down)."""
    _stop.set()


def _listen(broker_url: str) -> None:
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    while not _stop.is_set():
        try:
            r = keys.client(broker_url)
            with r.pubsub(ignore_subscribe_messages=True) as channel:
                channel.subscribe(keys.CONTROL)
                while not _stop.is_set():
                    message = channel.get_message(timeout=1.0)
                    if message is not None:
                        _answer(r, message, me)
        except Exception as exc:  # the broker went away: listen again once it is back
            log.warning("cancel channel lost (%s); listening again in 1 s", exc)
            _stop.wait(1.0)


def _answer(r: redis.Redis, message: dict[str, Any], me: dict[str, Any]) -> None:
    try:
        asked = json.loads(message["data"])
        stopped, ended = cancel_here(asked["run_id"], asked.get("tickets"), asked["why"])
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignored a control message that is not a cancel: %s", exc)
        return
    if stopped:
        log.warning("run %s: cancelled %d running step(s)", asked["run_id"], stopped)
    with r.pipeline() as pipe:
        pipe.rpush(asked["acks"], json.dumps({**me, "stopped": stopped, "ended": ended}))
        pipe.expire(asked["acks"], ACK_TTL_S)
        pipe.execute()


# --- the asking side: `ticketgraph cancel` (or a waiting run's command) ----------------------


@dataclass
class Delivery:
    """What a published cancel reached: listening processes, their answers, steps stopped."""

    listeners: int
    answers: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def stopped(self) -> int:
        """Running steps of the run that were stopped, on every process that answered."""
        return sum(int(a.get("stopped", 0)) for a in self.answers)

    @property
    def complete(self) -> bool:
        """Every listening process answered."""
        return len(self.answers) >= self.listeners


def publish(
    r: redis.Redis, run_id: str, tickets: list[str] | None, why: str, wait_s: float
) -> Delivery:
    """Tell every worker process to stop the run's running steps (or those of `tickets`),
    and wait up to `wait_s` for each listener's answer."""
    started = time.monotonic()
    acks = keys.control_acks(secrets.token_hex(6))
    asked = {"run_id": run_id, "tickets": tickets, "why": why, "acks": acks}
    delivery = Delivery(listeners=int(r.publish(keys.CONTROL, json.dumps(asked))))
    deadline = started + wait_s
    while not delivery.complete and (left := deadline - time.monotonic()) > 0:
        item = r.blpop([acks], timeout=max(left, 0.01))
        if item is not None:
            delivery.answers.append(json.loads(item[1]))
    r.delete(acks)
    delivery.elapsed_s = time.monotonic() - started
    return delivery
