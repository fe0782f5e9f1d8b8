"""Bounded fan-out without lanes: at most `pool_size` tickets of a per-ticket step in flight,
and a ticket that finishes hands its slot to the next one at once.

A fan-out keeps the tickets not yet started in a Redis list. `start` takes the first
`pool_size` of them (the caller sends one task each); when a ticket's task finishes,
`advance` pops the next ticket for the caller to send, and tells the task that finishes the
fan-out's last ticket to send the barrier (merge or report). Both are Lua scripts, so they are
atomic however many workers call them, and idempotent: a redelivered task gets the same answer
again and re-sends the same messages (at-least-once), which the per-ticket steps absorb
(`hold`, and the ticket's record says what is already done).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from orchestrator.coordination import keys
from orchestrator.coordination.clock import script

_START = """
local first = KEYS[5]
if redis.call('EXISTS', first) == 1 then
  return redis.call('LRANGE', first, 1, -1)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[4], KEYS[6], KEYS[7])
local pool = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local now = redis.call('TIME')[1]
local batch = {}
redis.call('RPUSH', first, '')
for i = 3, #ARGV do
  if #batch < pool then
    table.insert(batch, ARGV[i])
    redis.call('RPUSH', first, ARGV[i])
    redis.call('HSET', KEYS[7], ARGV[i], now)
  else
    redis.call('RPUSH', KEYS[1], ARGV[i])
  end
end
redis.call('SET', KEYS[3], #ARGV - 2, 'EX', ttl)
for i = 1, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
return batch
"""

# What holding a ticket for a delivery is, in both scripts that hold one: its owner key set
# to the delivery unless another holds it; true if this delivery holds it now.
_TAKE = """
local function take(owner, delivery, ttl)
  if redis.call('SET', owner, delivery, 'NX', 'EX', ttl) then return true end
  return redis.call('GET', owner) == delivery
end
"""

_ADVANCE = (
    _TAKE
    + """
local out = redis.call('HGET', KEYS[4], ARGV[1])
if not out then
  if redis.call('EXISTS', KEYS[3]) == 0 then return {'L', '0'} end
  local now = redis.call('TIME')[1]
  local nxt = redis.call('LPOP', KEYS[1]) or ''
  if nxt ~= '' then redis.call('HSET', KEYS[6], nxt, now) end
  redis.call('SADD', KEYS[2], ARGV[1])
  local fire = '0'
  if redis.call('SCARD', KEYS[2]) >= tonumber(redis.call('GET', KEYS[3]) or '0') then
    if redis.call('SET', KEYS[5], now, 'NX', 'EX', ARGV[2]) then fire = '1' end
  end
  out = fire .. nxt
  redis.call('HSET', KEYS[4], ARGV[1], out)
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  redis.call('EXPIRE', KEYS[4], ARGV[2])
end
local held = '0'
local nxt = string.sub(out, 2)
if ARGV[3] ~= '' and nxt ~= '' then
  local owner = ARGV[3] .. nxt
  if ARGV[6] == 'hold' then
    if take(owner, ARGV[4], ARGV[5]) then held = '1' end
  elseif redis.call('GET', owner) == ARGV[4] then
    redis.call('DEL', owner)
  end
end
return {out, held}
"""
)


# Tickets sent at least ARGV[1] seconds ago that no task has taken (no owner key) and that
# are not done: their message was lost (a worker killed between popping it and recording it
# as unacknowledged). They are stamped again, so each is re-sent at most once per period.
# The first element says whether the barrier was sent that long ago and not taken.
_SWEEP = """
local now = tonumber(redis.call('TIME')[1])
local age = tonumber(ARGV[1])
local out = {'0'}
local fired = redis.call('GET', KEYS[3])
if fired and now - tonumber(fired) >= age and redis.call('EXISTS', KEYS[4]) == 0 then
  out[1] = '1'
  redis.call('SET', KEYS[3], now, 'KEEPTTL')
end
local sent = redis.call('HGETALL', KEYS[2])
for i = 1, #sent, 2 do
  local ticket, at = sent[i], tonumber(sent[i + 1])
  if now - at >= age and redis.call('SISMEMBER', KEYS[1], ticket) == 0
     and redis.call('EXISTS', ARGV[2] .. ticket) == 0 then
    table.insert(out, ticket)
    redis.call('HSET', KEYS[2], ticket, now)
  end
end
return out
"""


_HOLD = (
    _TAKE
    + """
if take(KEYS[1], ARGV[1], ARGV[2]) then return 1 end
return 0
"""
)


@dataclass(frozen=True)
class FanOut:
    """One fan-out of a run: a per-ticket step (`name`) in one submission (`attempt`)."""

    run_id: str
    attempt: str
    name: str

    def key(self, part: str) -> str:
        """The Redis key of one part of this fan-out."""
        return keys.fan_out(self.run_id, self.attempt, self.name, part)

    def parts(self, *names: str) -> list[str]:
        """Keys of several parts, in order."""
        return [self.key(n) for n in names]


@dataclass(frozen=True)
class Handoff:
    """What a finished ticket's task sends on: the next ticket, and the barrier if last."""

    next_ticket: str | None
    barrier: bool
    lost: bool = False  # the fan-out's keys are gone (a broker restarted without its data)
    held: bool = False  # the next ticket is held for the delivery `advance` was given


def start(r: redis.Redis, fan: FanOut, ticket_ids: list[str], pool_size: int) -> list[str]:
    """Queue the fan-out's tickets and return the first `pool_size` for the caller to send."""
    first = script(r, _START)(
        keys=fan.parts("todo", "done", "total", "handoff", "first", "fired", "sent"),
        args=[pool_size, keys.RUN_TTL_S, *ticket_ids],
    )
    return [item.decode() for item in first]


def advance(
    r: redis.Redis,
    fan: FanOut,
    ticket_id: str,
    delivery: str = "",
    *,
    keep: bool = False,
    ttl_s: int = 0,
) -> Handoff:
    """Mark `ticket_id` finished; return the next ticket to send and whether this was the last.

    `delivery` is the finishing task's. With `keep` (the task runs the next ticket itself, in
    a row: coordination/slot.py) the next ticket is held for it for `ttl_s`, as `hold` would, in the
    same round trip (`Handoff.held`). Without it, a hold of the next ticket by this delivery
    is let go before the next ticket is sent a message: a copy of this task that died after
    holding it must not make that message step aside. Asked again for the same ticket, it
    answers as it did, and a redelivery (same delivery) holds the same next ticket again.
    The owner key is made in the script from `keys.owner`'s prefix, as the sweep's are.
    """
    if keep and (not delivery or ttl_s <= 0):
        raise ValueError("a kept ticket is held for a delivery, for a positive ttl_s")
    owner_prefix = keys.owner(fan.run_id, fan.attempt, fan.name, "") if delivery else ""
    out, held = script(r, _ADVANCE)(
        keys=fan.parts("todo", "done", "total", "handoff", "fired", "sent"),
        args=[
            ticket_id,
            keys.RUN_TTL_S,
            owner_prefix,
            delivery,
            ttl_s,
            "hold" if keep else "let go",
        ],
    )
    text = out.decode()
    if text == "L":
        return Handoff(next_ticket=None, barrier=False, lost=True)
    return Handoff(next_ticket=text[1:] or None, barrier=text[0] == "1", held=held == b"1")


def hold(r: redis.Redis, fan: FanOut, ticket_id: str, delivery: str, ttl_s: int) -> bool:
    """Take the ticket for one delivery of its task; False if another delivery holds it.

    A redelivered message has the same id as the one that died, so it takes its ticket
    back; a duplicate message (re-sent by a redelivered predecessor) has another id and
    steps aside while the ticket is held.
    """
    key = keys.owner(fan.run_id, fan.attempt, fan.name, ticket_id)
    return bool(script(r, _HOLD)(keys=[key], args=[delivery, ttl_s]) == 1)


@dataclass(frozen=True)
class Lost:
    """What a sweep found sent long ago and never taken."""

    tickets: list[str]
    barrier: bool


def sweep(r: redis.Redis, fan: FanOut, age_s: float) -> Lost:
    """Tickets (and the barrier) sent `age_s` or more ago that no task ever took."""
    owner_prefix = keys.owner(fan.run_id, fan.attempt, fan.name, "")
    raw = script(r, _SWEEP)(
        keys=fan.parts("done", "sent", "fired", "taken"), args=[int(age_s), owner_prefix]
    )
    return Lost(tickets=[t.decode() for t in raw[1:]], barrier=raw[0] == b"1")


def take_barrier(r: redis.Redis, fan: FanOut) -> None:
    """The barrier task after `fan` started: a sweep never sends it again."""
    r.set(fan.key("taken"), "1", ex=keys.RUN_TTL_S)
