"""The limits of ``limits.py`` shared by every instance through Redis.

Each key's state is one Redis hash changed only by the Lua scripts below, so a check and its
reservation are one atomic step across instances; the time is Redis's own (no clock skew
between instances). If Redis cannot be reached, each call falls back to this instance's
``LocalLimiter`` (logged once per outage and shown by ``kimi_ratelimit_degraded``) and Redis
is tried again a few seconds later: an outage never turns requests into errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from kimi_server.gate.limits import HELD_RETRY_SECONDS, Decision, Limits, LocalLimiter, Reason, Snapshot

log = logging.getLogger(__name__)

# KEYS[1]: the key's hash. ARGV: mode (0 peek, 1 reserve, 2 settle), rpm, tpm, budget
# (-1: none), spent seed, tokens (reserve: to take; settle: to refund), hold, cost, budget period
# (a new one restarts the spent figure from the seed), request units to give back (settle).
# Returns {admitted, reason (0 none, 1 requests, 2 tokens, 3 quota, 4 held by requests in
# flight), requests left * 1000, tokens left * 1000, wait ms}.
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local mode, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local budget, seed = tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens, hold, cost = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local period = ARGV[9]
local requests = tonumber(ARGV[10] or 0)
local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt', 'spent', 'held', 'p')
local function level(v, at, limit)
  if limit <= 0 then return 0 end
  if not v then return limit end
  return math.min(limit, tonumber(v) + (now - tonumber(at)) * limit / 60)
end
local r = level(h[1], h[2], rpm)
local tk = level(h[3], h[4], tpm)
local spent = seed
if (h[7] or '0') == period then spent = math.max(tonumber(h[5] or 0), seed) end
local held = tonumber(h[6] or 0)
local admitted, reason, wait = 1, 0, 0
if mode == 1 then
  if budget >= 0 and spent >= budget then
    admitted, reason = 0, 3
  elseif budget >= 0 and spent + held >= budget then
    admitted, reason, wait = 0, 4, HELD_WAIT
  elseif rpm > 0 and r < 1 then
    admitted, reason, wait = 0, 1, (1 - r) * 60 / rpm
  elseif tpm > 0 and tk <= 0 then
    admitted, reason, wait = 0, 2, (1 - tk) * 60 / tpm
  else
    if rpm > 0 then r = r - 1 end
    if tpm > 0 then tk = tk - tokens end
    if budget >= 0 then held = held + hold end
  end
elseif mode == 2 then
  if rpm > 0 then r = math.min(rpm, r + requests) end
  if tpm > 0 then tk = math.min(tpm, tk + tokens) end
  held = math.max(0, held - hold)
  spent = spent + cost
end
redis.call('HSET', KEYS[1], 'r', tostring(r), 'rt', tostring(now), 't', tostring(tk), 'tt', tostring(now),
  'spent', tostring(spent), 'held', tostring(held), 'p', period)
redis.call('EXPIRE', KEYS[1], 900)
return {admitted, reason, math.floor(r * 1000), math.floor(tk * 1000), math.floor(wait * 1000)}
""".replace("HELD_WAIT", repr(HELD_RETRY_SECONDS))

_REASONS: dict[int, Reason] = {1: "requests", 2: "tokens", 3: "quota", 4: "held"}
RETRY_SECONDS = 5.0
# Generous: a busy event loop can delay a healthy reply, and a false alarm drops to per-instance
# limits for RETRY_SECONDS.
TIMEOUT = 2.0


class RedisLimiter:
    def __init__(self, url: str, prefix: str, on_degraded: Callable[[bool], None] | None = None) -> None:
        self._redis = aioredis.Redis.from_url(url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT)
        self._script = self._redis.register_script(_SCRIPT)
        self._prefix = prefix
        self._local = LocalLimiter()
        self._down_since: float | None = None
        self._on_degraded = on_degraded

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    async def _run(
        self, key_id: str, limits: Limits, mode: int, tokens: int, hold: int, cost: int, requests: int = 0
    ) -> list[int] | None:
        if self._down_since is not None and time.monotonic() - self._down_since < RETRY_SECONDS:
            return None
        budget = limits.budget_nanos if limits.budget_nanos is not None else -1
        args = [mode, limits.rpm or 0, limits.tpm or 0, budget, limits.spent_nanos, tokens, hold, cost, limits.period]
        args.append(requests)
        try:
            result = await self._call(f"{self._prefix}rl:{key_id}", args)
        except (RedisError, OSError) as exc:
            if self._down_since is None:
                log.warning("redis unreachable (%s): rate limits are per instance until it is back", type(exc).__name__)
                if self._on_degraded:
                    self._on_degraded(True)
            self._down_since = time.monotonic()
            return None
        if self._down_since is not None:
            log.warning("redis reachable again: rate limits are shared across instances")
            self._down_since = None
            if self._on_degraded:
                self._on_degraded(False)
        return [int(v) for v in result]

    async def _call(self, key: str, args: list[int]) -> Any:
        try:
            return await self._script(keys=[key], args=args)
        except (RedisConnectionError, ConnectionError):
            # After a Redis restart every pooled connection is dead, though Redis is back: drop
            # the idle ones and try once more on a fresh one before falling back. A timeout is
            # not retried: it already took TIMEOUT seconds.
            await self._redis.connection_pool.disconnect(inuse_connections=False)
            return await self._script(keys=[key], args=args)

    @staticmethod
    def _snapshot(limits: Limits, out: list[int]) -> Snapshot:
        return Snapshot(limits.rpm, out[2] / 1000, limits.tpm, out[3] / 1000)

    async def reserve(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision:
        out = await self._run(key_id, limits, 1, tokens, cost_nanos, 0)
        if out is None:
            return self._local.reserve_now(key_id, limits, tokens, cost_nanos)
        snap = self._snapshot(limits, out)
        if out[0]:
            return Decision(True, snap)
        return Decision(False, snap, _REASONS[out[1]], out[4] / 1000)

    async def settle(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        if await self._run(key_id, limits, 2, refund_tokens, hold_nanos, cost_nanos, requests) is None:
            self._local.settle_now(key_id, limits, refund_tokens, hold_nanos, cost_nanos, requests)

    async def peek(self, key_id: str, limits: Limits) -> Snapshot:
        out = await self._run(key_id, limits, 0, 0, 0, 0)
        if out is None:
            return await self._local.peek(key_id, limits)
        return self._snapshot(limits, out)

    async def close(self) -> None:
        await self._redis.aclose()
