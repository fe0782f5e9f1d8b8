"""A run's budget in USD, held by every worker on every machine: one ledger in Redis.

Before a model call, its worker holds the call's worst case (workers/meter.py) with one
atomic script: the hold is refused when what is settled plus what is held plus this call
would pass the run's limit (or the ticket's). After the reply it settles the real cost
and the rest goes back. A hold lives under a lease that the worker's process renews while
the call is in flight (coordination/leases.py), so a SIGKILLed worker's hold returns within
the lease. Once a call is refused for the run's limit the ledger is spent: no later call of
the run starts, so tickets not yet started are not started (their tickets end `budget`,
and `resume --budget` with a higher limit takes them up, paying only for what was not
done).

The durable copy is the run folder: every paid turn is in its agent's state (agents/*.json,
fsync'd before the next step), so when the ledger is gone (Redis lost its data, or a run
from before budgets is resumed) the next hold seeds it from there. If Redis cannot be
reached no call starts: the meter fails closed.

Amounts are integers of nano-USD in Redis, so concurrent settlements add exactly.

    tg:run:<run_id>:budget         hash: limit, settled, held, spent (0/1), calls, estimated,
                                   refused, expired, ticket_limit, t:<ticket>:settled/held
    tg:run:<run_id>:budget:holds   hash: hold id -> "<nano-USD> <ticket>"
    tg:run:<run_id>:budget:leases  sorted set: hold id -> lease end (ms, Redis's clock)
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import redis

from orchestrator.coordination import keys, leases
from orchestrator.run import totals
from orchestrator.run.records import BudgetTotals, RunConfig
from orchestrator.run.store import RunStore
from workers.meter import OverBudget, WorstCase
from workers.usage import Usage

log = logging.getLogger(__name__)

NANO = 1_000_000_000

# Drops holds whose lease ended (their holder died); shared by every script below.
_EXPIRE = (
    leases.NOW_MS
    + """
local budget, holds, leases = KEYS[1], KEYS[2], KEYS[3]
local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
for _, id in ipairs(dead) do
  local v = redis.call('HGET', holds, id)
  if v then
    local amount, ticket = string.match(v, '^(%d+) (.*)$')
    redis.call('HINCRBY', budget, 'held', -tonumber(amount))
    if ticket ~= '' then
      redis.call('HINCRBY', budget, 't:' .. ticket .. ':held', -tonumber(amount))
    end
    redis.call('HDEL', holds, id)
    redis.call('HINCRBY', budget, 'expired', 1)
  end
  redis.call('ZREM', leases, id)
end
"""
)

# ARGV: hold id, nano-USD, ticket ('' for none), lease ms. -> {verdict, remaining, held}
_HOLD = (
    _EXPIRE
    + """
if redis.call('EXISTS', budget) == 0 then return {'missing', 0} end
local b = redis.call('HMGET', budget, 'limit', 'settled', 'held', 'spent', 'ticket_limit')
local limit, settled, held = tonumber(b[1]), tonumber(b[2] or 0), tonumber(b[3] or 0)
local amount, ticket = tonumber(ARGV[2]), ARGV[3]
local remaining = limit - settled - held
if b[4] == '1' then
  redis.call('HINCRBY', budget, 'refused', 1)
  return {'spent', remaining, held}
end
if settled + held + amount > limit then
  redis.call('HSET', budget, 'spent', 1)
  redis.call('HINCRBY', budget, 'refused', 1)
  return {'spent', remaining, held}
end
local ticket_limit = tonumber(b[5] or 0)
if ticket ~= '' and ticket_limit > 0 then
  local tb = redis.call('HMGET', budget, 't:' .. ticket .. ':settled', 't:' .. ticket .. ':held')
  local tleft = ticket_limit - tonumber(tb[1] or 0) - tonumber(tb[2] or 0)
  if amount > tleft then
    redis.call('HINCRBY', budget, 'refused', 1)
    return {'ticket', tleft}
  end
end
redis.call('HINCRBY', budget, 'held', amount)
if ticket ~= '' then redis.call('HINCRBY', budget, 't:' .. ticket .. ':held', amount) end
redis.call('HSET', holds, ARGV[1], ARGV[2] .. ' ' .. ticket)
redis.call('ZADD', leases, now + tonumber(ARGV[4]), ARGV[1])
local ttl = redis.call('TTL', budget)
if ttl > 0 then
  redis.call('EXPIRE', holds, ttl)
  redis.call('EXPIRE', leases, ttl)
end
return {'ok', remaining - amount}
"""
)

# ARGV: hold id, nano-USD paid (-1: nothing was paid, release), ticket, estimated (0/1)
_SETTLE = (
    _EXPIRE
    + """
local v = redis.call('HGET', holds, ARGV[1])
if v then
  local amount = tonumber(string.match(v, '^(%d+) '))
  redis.call('HINCRBY', budget, 'held', -amount)
  if ARGV[3] ~= '' then redis.call('HINCRBY', budget, 't:' .. ARGV[3] .. ':held', -amount) end
  redis.call('HDEL', holds, ARGV[1])
  redis.call('ZREM', leases, ARGV[1])
end
local paid = tonumber(ARGV[2])
if paid < 0 or redis.call('EXISTS', budget) == 0 then return 0 end
redis.call('HINCRBY', budget, 'settled', paid)
if ARGV[3] ~= '' then redis.call('HINCRBY', budget, 't:' .. ARGV[3] .. ':settled', paid) end
redis.call('HINCRBY', budget, 'calls', 1)
redis.call('HINCRBY', budget, 'estimated', tonumber(ARGV[4]))
return 1
"""
)

# ARGV: limit, ticket limit, settled (the folder's), ttl s. Raises the limit and lifts `spent`
# of a ledger that exists; seeds one that does not from the folder's total.
_OPEN = (
    _EXPIRE
    + """
if redis.call('EXISTS', budget) == 0 then
  redis.call('HSET', budget, 'settled', ARGV[3], 'held', 0, 'calls', 0, 'estimated', 0,
    'refused', 0, 'expired', 0)
end
redis.call('HSET', budget, 'limit', ARGV[1], 'ticket_limit', ARGV[2], 'spent', 0)
for _, k in ipairs(KEYS) do redis.call('EXPIRE', k, tonumber(ARGV[4])) end
return 1
"""
)


# Holds whose lease ended go back first, so what is shown is what a new hold would see.
_READ = _EXPIRE + "\nreturn redis.call('HGETALL', budget)\n"


def to_nano(usd: float) -> int:
    """USD as whole nano-dollars, rounded up (a hold never holds less than the call)."""
    return max(int(-(-usd * NANO // 1)), 0)


# The most a limit may be: amounts are exact in Redis's Lua up to 2**53 nano-USD ($9M).
MAX_USD = 1_000_000.0


@dataclass(frozen=True)
class Limits:
    """What a run may spend: in all, and per ticket (None: no limit)."""

    run_usd: float | None
    ticket_usd: float | None = None

    @property
    def any(self) -> bool:
        """True if the run has a ledger: a limit in all or per ticket."""
        return self.run_usd is not None or self.ticket_usd is not None


class Ledger:
    """One run's budget in Redis."""

    def __init__(self, r: redis.Redis, run_id: str) -> None:
        self.r = r
        self.keys = [keys.budget(run_id, part) for part in ("", "holds", "leases")]
        self._hold = r.register_script(_HOLD)
        self._settle = r.register_script(_SETTLE)
        self._renew = r.register_script(leases.RENEW)
        self._open = r.register_script(_OPEN)
        self._read = r.register_script(_READ)

    def open(self, limits: Limits, settled_usd: float) -> None:
        """Set the limits (lifting `spent`); a ledger that is gone starts at `settled_usd`,
        what the run folder says was paid (an existing one keeps its own)."""
        run_usd = MAX_USD if limits.run_usd is None else limits.run_usd
        args = [to_nano(run_usd), to_nano(limits.ticket_usd or 0), to_nano(settled_usd)]
        self._open(keys=self.keys, args=[*args, keys.RUN_TTL_S])

    def hold(self, hold_id: str, nano: int, ticket: str) -> tuple[str, int, int]:
        """('ok' | 'spent' | 'ticket' | 'missing', nano-USD remaining, nano-USD held by
        other calls when the run's limit refused it, else 0)."""
        verdict, remaining, *held = self._hold(
            keys=self.keys, args=[hold_id, nano, ticket, leases.lease_ms()]
        )
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        return verdict, int(remaining), int(held[0]) if held else 0

    def settle(self, hold_id: str, nano: int, ticket: str, estimated: bool) -> None:
        """Settle (`nano` ≥ 0) or release (`nano` = -1) one hold."""
        self._settle(keys=self.keys, args=[hold_id, nano, ticket, int(estimated)])

    def renew(self, hold_ids: list[str]) -> None:
        """Push the leases of holds still in flight forward."""
        if hold_ids:
            self._renew(keys=[self.keys[2]], args=[leases.lease_ms(), *hold_ids])

    def totals(self) -> BudgetTotals | None:
        """The ledger now (holds whose lease ended not counted), or None if it is gone."""
        raw = self._read(keys=self.keys)
        values = {raw[i].decode(): raw[i + 1].decode() for i in range(0, len(raw), 2)}
        if "limit" not in values:
            return None
        held = int(values.get("held", 0))
        limit, settled = int(values["limit"]), int(values.get("settled", 0))
        return BudgetTotals(
            limit_usd=limit / NANO,
            reserved_usd=held / NANO,
            settled_usd=settled / NANO,
            remaining_usd=max(limit - settled - held, 0) / NANO,
            calls=int(values.get("calls", 0)),
            estimated=int(values.get("estimated", 0)),
            refused=int(values.get("refused", 0)),
            expired=int(values.get("expired", 0)),
            spent=values.get("spent") == "1",
        )


def folder_spent(store: RunStore) -> float:
    """What the run folder says the run has paid: every agent run's paid turns."""
    return totals.paid(store).cost_usd


def limits(config: RunConfig) -> Limits:
    """The run's limits as its configuration fixed them."""
    return Limits(config.run_budget_usd, config.ticket_budget_usd)


def snapshot(r: redis.Redis, store: RunStore) -> BudgetTotals | None:
    """Copy the ledger as it is into run.json (`budget`), where `status`, `runs` and the
    report read it once the run's Redis is gone; None if the run has no ledger."""
    if not limits(store.meta().config).any:
        return None
    try:
        ledger = Ledger(r, store.run_id).totals()
    except redis.RedisError as exc:
        log.warning("budget: cannot read the ledger of %s (%s)", store.run_id, exc)
        return None
    if ledger is not None:
        with store.locked():
            meta = store.meta()
            was = (meta.budget, meta.totals)
            meta.budget = ledger
            totals.agree(meta)  # an ended run's: what its folder says was paid
            # Written only if it changed: the end agreed its budget already, and a run.json
            # written after run-state.json would have the CLI materialise every record again.
            if (meta.budget, meta.totals) != was:
                store.write_meta(meta)
    return ledger


def read_live(broker_url: str | None, run_id: str) -> BudgetTotals | None:
    """The ledger as it is now in the broker's Redis, for `status` of a running run; None
    without a broker URL, a ledger, or an answer within a second."""
    if not broker_url:
        return None
    try:
        r = redis.Redis.from_url(
            keys.redis_py_url(broker_url), socket_connect_timeout=1, socket_timeout=1
        )
        try:
            return Ledger(r, run_id).totals()
        finally:
            r.close()
    except (redis.RedisError, ValueError):
        return None


def open_ledger(r: redis.Redis, store: RunStore, limits: Limits) -> None:
    """Open the run's ledger at submission (or resume): its limits, and, if Redis has no
    ledger of the run, what the folder says was paid (reading every agent's state only then)."""
    if limits.any:
        ledger = Ledger(r, store.run_id)
        gone = not r.exists(ledger.keys[0])
        ledger.open(limits, folder_spent(store) if gone else 0.0)


# --- the meter a worker's agents use --------------------------------------------------------


class RunMeter:
    """`workers.meter.Meter` over the run's ledger, for one ticket's (or the router's) calls."""

    def __init__(self, r: redis.Redis, store: RunStore, limits: Limits, ticket: str) -> None:
        self.ledger = Ledger(r, store.run_id)
        self.store, self.limits, self.ticket = store, limits, ticket

    def hold(self, worst: WorstCase) -> _Hold:
        hold_id = secrets.token_hex(8)
        nano = to_nano(worst.usd)
        try:
            verdict, remaining, held = self.ledger.hold(hold_id, nano, self.ticket)
            if verdict == "missing":  # Redis lost it: the folder knows what was paid
                self.ledger.open(self.limits, folder_spent(self.store))
                verdict, remaining, held = self.ledger.hold(hold_id, nano, self.ticket)
        except redis.RedisError as exc:
            raise OverBudget(
                f"the run's budget ledger cannot be reached ({exc}); no call starts without it"
            ) from exc
        if verdict == "spent":
            # What is left at the end (the report) is more: the held calls settle for less.
            raise OverBudget(
                f"run budget: ${max(remaining, 0) / NANO:.4f} left of "
                f"${self.limits.run_usd or MAX_USD:.4f} while calls in flight held "
                f"${held / NANO:.4f}, this call may cost ${nano / NANO:.4f}"
            )
        if verdict == "ticket":
            raise OverBudget(
                f"ticket budget: ${max(remaining, 0) / NANO:.4f} left of "
                f"${self.limits.ticket_usd:.4f}, this call may cost ${nano / NANO:.4f}"
            )
        leases.renewer.add(self.ledger.keys[0], self.ledger.renew, hold_id)
        return _Hold(self, hold_id)


class _Hold:
    def __init__(self, meter: RunMeter, hold_id: str) -> None:
        self.meter, self.hold_id = meter, hold_id

    def settle(self, usd: float, usage: Usage) -> None:
        self._end(to_nano(usd), usage.estimated)

    def release(self) -> None:
        self._end(-1, False)

    def _end(self, nano: int, estimated: bool) -> None:
        leases.renewer.drop(self.meter.ledger.keys[0], self.hold_id)
        try:
            self.meter.ledger.settle(self.hold_id, nano, self.meter.ticket, estimated)
        except redis.RedisError as exc:
            # The hold's lease returns it; the money paid is in the agent's state, and the
            # ledger is seeded from there if it was lost.
            log.warning("budget: cannot settle hold %s (%s)", self.hold_id, exc)
