"""The failure counts of ``failure_counts.py`` kept in Redis, so every instance on it throttles
the same addresses and key prefixes.

A read and a count are one Lua script each (one round trip, atomic across instances); the time
is Redis's own. If Redis cannot be reached, this instance counts alone (logged once per outage)
and tries Redis again a few seconds later: an outage never turns sign-ins into errors.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from kimi_server.gate.failure_counts import Buckets, Drain, LocalCounts, Tally

log = logging.getLogger(__name__)

# KEYS: the address's hash, the prefix's hash, the known pair's key. ARGV: add (0 or 1), the
# address's and the prefix's drain per second, seconds an idle count is kept.
# Returns {address level, prefix level, known (0 or 1)}, the levels as strings.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local add = tonumber(ARGV[1])
local out = {}
for i = 1, 2 do
  local h = redis.call('HMGET', KEYS[i], 'l', 't')
  local level = 0
  if h[1] then
    level = math.max(0, tonumber(h[1]) - math.max(0, now - tonumber(h[2])) * tonumber(ARGV[i + 1]))
  end
  if add == 1 then
    level = level + 1
    redis.call('HSET', KEYS[i], 'l', tostring(level), 't', tostring(now))
    redis.call('EXPIRE', KEYS[i], ARGV[4])
  end
  out[i] = tostring(level)
end
out[3] = redis.call('EXISTS', KEYS[3])
return out
"""
RETRY_SECONDS = 5.0
TIMEOUT = 2.0  # generous: a false alarm only counts per instance for RETRY_SECONDS


class RedisCounts:
    def __init__(self, url: str, prefix: str, drain: Drain) -> None:
        self._redis = aioredis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
        self._script = self._redis.register_script(_SCRIPT)
        self._prefix = prefix + "auth:"
        self._drain = drain
        self._local = LocalCounts(drain)
        self._down_since: float | None = None

    async def _run(self, buckets: Buckets, add: bool) -> Tally | None:
        keys = [self._prefix + b for b in (buckets.address, buckets.prefix, buckets.known)]
        args = [int(add), self._drain.address, self._drain.prefix, math.ceil(self._drain.keep)]
        out = await self._guarded(lambda: self._script(keys=keys, args=args))
        if out is None:
            return None
        return Tally(float(out[0]), float(out[1]), bool(int(out[2])))

    async def _guarded(self, call: Any) -> Any:
        """``call()``'s result, or None while Redis is out of reach."""
        if self._down_since is not None and time.monotonic() - self._down_since < RETRY_SECONDS:
            return None
        try:
            result = await call()
        except (RedisError, OSError) as exc:
            if self._down_since is None:
                log.warning("redis unreachable (%s): failed sign-ins are counted per instance", type(exc).__name__)
            self._down_since = time.monotonic()
            # After a Redis restart the pooled connections are dead: the next try gets a fresh one.
            await self._redis.connection_pool.disconnect(inuse_connections=False)
            return None
        if self._down_since is not None:
            log.warning("redis reachable again: failed sign-ins are counted across instances")
            self._down_since = None
        return result

    async def read(self, buckets: Buckets) -> Tally:
        tally = await self._run(buckets, add=False)
        return tally if tally is not None else self._local.read_now(buckets)

    async def add(self, buckets: Buckets) -> Tally:
        tally = await self._run(buckets, add=True)
        return tally if tally is not None else self._local.add_now(buckets)

    async def remember(self, known: str) -> None:
        seconds = math.ceil(self._drain.remember)
        done = await self._guarded(lambda: self._redis.set(self._prefix + known, b"1", ex=seconds))
        if done is None:
            self._local.remember_now(known)

    async def close(self) -> None:
        await self._redis.aclose()
