"""The broker's clock: what every machine's decisions about time are measured on.

Workers run on machines whose wall clocks disagree (a VM resumed from a snapshot, NTP not yet
synced, a container on a host set by hand). Anything several of them compare — when a
message was delivered and whether its holder is still alive, when a lease ends — is stamped
and judged on Redis's own clock (`TIME`, read inside the script that writes or reads the
stamp), never on a worker's `time.time()`. A worker's own clock then only measures intervals
(`time.monotonic`), which a skewed wall clock does not touch.
"""

from __future__ import annotations

from typing import Any

import redis

# Lua: `now`, Redis's clock in seconds with its microseconds (kombu's unacked index is
# scored in seconds). A double holds today's epoch to the microsecond.
NOW_S = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# Lua: `now`, Redis's clock in ms (leases are scored in ms).
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""


def script(r: redis.Redis, source: str) -> Any:
    """A Lua script bound to `r`, registered once per client (it runs by its SHA)."""
    cache: dict[str, Any] = r.__dict__.setdefault("_ticketgraph_scripts", {})
    if source not in cache:
        cache[source] = r.register_script(source)
    return cache[source]
