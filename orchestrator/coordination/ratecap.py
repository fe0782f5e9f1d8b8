"""One cap on what every worker, of every run and machine, sends to one model endpoint.

`LLM_MAX_INFLIGHT` bounds the requests in flight and `LLM_MAX_TPM` the tokens per minute
(each request counted before it goes as its prompt and longest reply, then corrected to
what it really used), both keyed by the endpoint's base URL and model, in Redis. A slot in
flight lives under a lease its process renews (coordination/leases.py): a SIGKILLed holder's slot
is back within its lease. A 429 with Retry-After sets a cool-down on the endpoint that every
worker waits out, instead of each retrying into it. Set the same caps on every worker: each
request is admitted against the caps of the worker that sends it.

Its keys are `tg:cap:<endpoint>:*` (coordination/keys.py).

Without a cap set no gate is made and a request goes at once, as before.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass

import redis

from orchestrator.coordination import keys as redis_keys
from orchestrator.coordination import leases
from workers.cancel import CancelToken
from workers.errors import ProviderError
from workers.model.gate import OnWait
from workers.settings import HarnessSettings

log = logging.getLogger(__name__)

BUSY_WAIT_S = (0.01, 0.05)  # a full cap is asked again after a random wait in this range
MAX_WAIT_STEP_S = 1.0

# ARGV: slot id, max in flight (0: none), max tokens per window (0: none), tokens, lease ms,
# window ms. -> {verdict, ms to wait}
_ENTER = (
    leases.NOW_MS
    + """
local inflight, tpm, tokens, cool = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local wait = redis.call('PTTL', cool)
if wait > 0 then return {'cool', wait} end
local max_inflight, max_tpm, need = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if max_inflight > 0 then
  redis.call('ZREMRANGEBYSCORE', inflight, '-inf', now)
  if redis.call('ZCARD', inflight) >= max_inflight then return {'busy', 0} end
end
if max_tpm > 0 then
  local window = tonumber(ARGV[6])
  local old = redis.call('ZRANGEBYSCORE', tpm, '-inf', now - window)
  for _, id in ipairs(old) do
    local n = redis.call('HGET', tokens, id)
    if n then redis.call('HINCRBY', tokens, '_sum', -tonumber(n)) end
    redis.call('HDEL', tokens, id)
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', tpm, '-inf', now - window) end
  local used = tonumber(redis.call('HGET', tokens, '_sum') or 0)
  if used > 0 and used + need > max_tpm then
    local first = redis.call('ZRANGE', tpm, 0, 0, 'WITHSCORES')
    local free_at = first[2] and (tonumber(first[2]) + window) or now
    return {'tpm', math.max(free_at - now, 1)}
  end
  redis.call('ZADD', tpm, now, ARGV[1])
  redis.call('HSET', tokens, ARGV[1], need)
  redis.call('HINCRBY', tokens, '_sum', need)
  redis.call('EXPIRE', tpm, 3600)
  redis.call('EXPIRE', tokens, 3600)
end
if max_inflight > 0 then
  redis.call('ZADD', inflight, now + tonumber(ARGV[5]), ARGV[1])
  redis.call('EXPIRE', inflight, 3600)
end
return {'ok', 0}
"""
)

# ARGV: slot id, tokens really used (-1: unknown). Frees the slot; the request's tokens now
# count from its end (when the server counted them), corrected to what it used.
_DONE = (
    leases.NOW_MS
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
local n = redis.call('HGET', KEYS[3], ARGV[1])
if n then
  redis.call('ZADD', KEYS[2], 'XX', now, ARGV[1])
  local used = tonumber(ARGV[2])
  if used >= 0 then
    redis.call('HSET', KEYS[3], ARGV[1], used)
    redis.call('HINCRBY', KEYS[3], '_sum', used - tonumber(n))
  end
end
return 1
"""
)

# ARGV: ms. The cool-down only ever grows.
_COOL = """
if redis.call('PTTL', KEYS[4]) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[4], 1, 'PX', tonumber(ARGV[1]))
end
return 1
"""


@dataclass(frozen=True)
class Caps:
    """An endpoint's caps (None: not capped) and the token window (60 s: per minute)."""

    max_inflight: int | None
    max_tpm: int | None
    window_s: float = 60.0

    @property
    def any(self) -> bool:
        """True if something is capped."""
        return bool(self.max_inflight or self.max_tpm)


class RedisGate:
    """`workers.model.gate.Gate` over Redis, for one base URL (keys per model)."""

    def __init__(self, r: redis.Redis, base_url: str, caps: Caps) -> None:
        self.r, self.base_url, self.caps = r, base_url, caps
        self.counts_tokens = bool(caps.max_tpm)
        self._enter = r.register_script(_ENTER)
        self._done = r.register_script(_DONE)
        self._renew = r.register_script(leases.RENEW)
        self._cool = r.register_script(_COOL)

    def enter(
        self, model: str, tokens: int, cancel: CancelToken | None, on_wait: OnWait | None = None
    ) -> _Slot:
        keys = redis_keys.cap(self.base_url, model)
        slot_id = secrets.token_hex(8)
        if self.caps.max_tpm and tokens > self.caps.max_tpm:
            raise ProviderError(
                f"a request of up to {tokens} tokens can never fit LLM_MAX_TPM="
                f"{self.caps.max_tpm}: raise it, or lower max_tokens"
            )
        args = [
            slot_id,
            self.caps.max_inflight or 0,
            self.caps.max_tpm or 0,
            tokens,
            leases.lease_ms(),
            int(self.caps.window_s * 1000),
        ]
        waited = False
        try:
            while (pause := self._admitted(keys, args)) is not None:
                if not waited and on_wait is not None:
                    on_wait(pause[1])
                waited = True
                if cancel is not None:
                    cancel.sleep(pause[0])
                else:
                    time.sleep(pause[0])
        finally:
            if waited and on_wait is not None:
                on_wait(None)
        if self.caps.max_inflight:
            leases.renewer.add(keys[0], lambda ids: self._renew_slots(keys, ids), slot_id)
        return _Slot(self, keys, slot_id, waited)

    def _admitted(self, keys: list[str], args: list[object]) -> tuple[float, str] | None:
        """None if the request may go now (its slot taken); else how long to pause before
        asking again, and the cap it waits for (`inflight`, `tpm` or `cool`)."""
        try:
            verdict, wait_ms = self._enter(keys=keys, args=args)
        except redis.RedisError as exc:
            raise ProviderError(
                f"cannot reach the broker's Redis for the endpoint's caps ({exc}); a "
                "request does not go past LLM_MAX_INFLIGHT/LLM_MAX_TPM unchecked"
            ) from exc
        if verdict == b"ok":
            return None
        if verdict == b"busy":
            return random.uniform(*BUSY_WAIT_S), "inflight"
        # cool-down or token rate: until it ends, a little jittered
        pause = min(int(wait_ms) / 1000, MAX_WAIT_STEP_S) * random.uniform(1.0, 1.2)
        return pause, "cool" if verdict == b"cool" else "tpm"

    def _renew_slots(self, keys: list[str], ids: list[str]) -> None:
        self._renew(keys=keys[:1], args=[leases.lease_ms(), *ids])

    def cool_down(self, model: str, seconds: float) -> None:
        try:
            self._cool(keys=redis_keys.cap(self.base_url, model), args=[int(seconds * 1000)])
        except redis.RedisError as exc:
            log.warning("cannot set the endpoint's cool-down (%s)", exc)


class _Slot:
    def __init__(self, gate: RedisGate, keys: list[str], slot_id: str, waited: bool) -> None:
        self.gate, self.keys, self.slot_id, self.waited = gate, keys, slot_id, waited

    def done(self, tokens: int | None) -> None:
        leases.renewer.drop(self.keys[0], self.slot_id)
        used = -1 if tokens is None else tokens
        try:
            self.gate._done(keys=self.keys, args=[self.slot_id, used])
        except redis.RedisError as exc:  # the lease gives the slot back
            log.warning("cannot free a slot of the endpoint's cap (%s)", exc)


def caps_of(llm: HarnessSettings) -> Caps:
    """The caps LLM_MAX_INFLIGHT, LLM_MAX_TPM and LLM_TPM_WINDOW_S set."""
    return Caps(llm.max_inflight, llm.max_tpm, llm.tpm_window_s)


def gate_for(r: redis.Redis | None, llm: HarnessSettings) -> RedisGate | None:
    """The gate of `llm`'s endpoint, or None when nothing is capped (or no Redis is at hand:
    the harness alone, outside the graph)."""
    caps = caps_of(llm)
    if r is None or not caps.any or not llm.base_url:
        return None
    return RedisGate(r, llm.base_url, caps)
