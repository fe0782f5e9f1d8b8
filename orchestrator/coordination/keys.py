"""Redis keys of a run's coordination, built in one place, and the client that reaches them.

Everything here is derived and short-lived: the durable copy of a run is its folder on the
shared volume, and `resume` rebuilds these keys from it, so each key carries a TTL: the
run's (RUN_TTL_S, 7 days) for all but the owner keys, which live as long as a task may run
(its hard time limit plus a minute: a dead holder's claim lapses with it).

    tg:run:<run_id>:events                     list: node and run events for the waiting CLI
    tg:run:<run_id>:<attempt>:submitted        flag: gone if the broker lost its data
    tg:run:<run_id>:<attempt>:<step>:todo      list: ticket ids not yet handed to a task
    tg:run:<run_id>:<attempt>:<step>:done      set: tickets whose task has finished
    tg:run:<run_id>:<attempt>:<step>:total     int: tickets in the fan-out
    tg:run:<run_id>:<attempt>:<step>:handoff   hash: ticket -> what its task handed on
    tg:run:<run_id>:<attempt>:<step>:first     list: the tickets the fan-out started with
    tg:run:<run_id>:<attempt>:<step>:fired     time the fan-out's barrier was sent
    tg:run:<run_id>:<attempt>:<step>:taken     flag: the barrier's task started
    tg:run:<run_id>:<attempt>:<step>:sent      hash: ticket -> time its task was sent
    tg:run:<run_id>:<attempt>:<step>:owner:<t> the delivery that holds ticket t
    tg:run:<run_id>:budget[:holds|:leases]     the run's budget ledger (coordination/budget.py)
    tg:cap:<endpoint>:inflight                 sorted set: slot id -> lease end (ms, Redis clock)
    tg:cap:<endpoint>:tpm, :tokens             a request's admission time; its tokens, `_sum`
    tg:cap:<endpoint>:cool                     set while the endpoint asked us to wait
    tg:control                                 channel: cancels for every worker process
    tg:control:<nonce>:acks                    list: each process's answer to one cancel

`<step>` is a per-ticket step of the plan (draft, review); `<attempt>` a fresh id per
submission, so a resumed run never mixes with the keys of the one it replaces.
"""

from __future__ import annotations

import hashlib
import os
import threading
from urllib.parse import parse_qs, urlsplit

import redis

PREFIX = "tg:run"
# Coordination keys outlive any run worth resuming from them; after that, resume rebuilds
# them from the run folder.
RUN_TTL_S = 7 * 24 * 3600

_clients: dict[tuple[int, str], redis.Redis] = {}
_lock = threading.Lock()


CONTROL = "tg:control"


def budget(run_id: str, part: str = "") -> str:
    """The run's budget ledger (coordination/budget.py): the hash, or its `holds` and `leases`."""
    return f"{PREFIX}:{run_id}:budget" + (f":{part}" if part else "")


def cap(base_url: str, model: str) -> list[str]:
    """The caps of one model endpoint (coordination/ratecap.py): inflight, tpm, tokens, cool."""
    name = hashlib.sha1(f"{base_url.rstrip('/')}|{model}".encode()).hexdigest()[:16]
    return [f"tg:cap:{name}:{part}" for part in ("inflight", "tpm", "tokens", "cool")]


def control_acks(nonce: str) -> str:
    """Where worker processes answer one cancel (coordination/control.py)."""
    return f"{CONTROL}:{nonce}:acks"


def events(run_id: str) -> str:
    """The run's event list, read by the CLI that waits for the verdict."""
    return f"{PREFIX}:{run_id}:events"


def submitted(run_id: str, attempt: str) -> str:
    """Set when a submission starts: if it vanishes, the broker lost the run's messages."""
    return f"{PREFIX}:{run_id}:{attempt}:submitted"


def fan_out(run_id: str, attempt: str, name: str, part: str) -> str:
    """One part (todo, done, total, handoff, first, fired, sent, taken) of the fan-out of the
    per-ticket step `name`."""
    return f"{PREFIX}:{run_id}:{attempt}:{name}:{part}"


def owner(run_id: str, attempt: str, name: str, ticket_id: str) -> str:
    """Which delivery holds a ticket in the fan-out of step `name`."""
    return f"{PREFIX}:{run_id}:{attempt}:{name}:owner:{ticket_id}"


def client(broker_url: str) -> redis.Redis:
    """One redis-py client per broker URL per process (made after a fork, never shared).

    Its pool has no cap of its own: each call takes a connection and gives it back, so a
    process holds at most one a thread. redis-py 8 caps a pool at 100 by default and fails
    the 101st call at once ("Too many connections"): at pool 512 a worker process has 256
    threads, and a hand-on that met the cap waited out the broker-outage retry."""
    key = (os.getpid(), broker_url)
    with _lock:
        if key not in _clients:
            url = redis_py_url(broker_url)
            _clients[key] = redis.Redis.from_url(url, max_connections=NO_CAP)
        return _clients[key]


NO_CAP = 2**31  # connections a process's pool may open: as many as its threads ask for


def redis_py_url(broker_url: str) -> str:
    """The redis-py form of a Celery broker URL (`redis+socket://` and `socket://` become
    `unix://`; `redis://`, `rediss://` and `unix://` are redis-py's own)."""
    if not broker_url.startswith(("redis+socket://", "socket://")):
        return broker_url
    parts = urlsplit(broker_url)
    db = parse_qs(parts.query).get("virtual_host", ["0"])[0]
    return f"unix://{parts.path}?db={db}"
