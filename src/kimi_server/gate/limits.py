"""Per-key rate limits (requests and tokens per minute) and budget holds, in this process.

Both limits are token buckets that hold one minute's allowance and refill continuously. A
request is admitted while its buckets are not empty and then takes its whole reservation
(1 request; prompt estimate + output cap tokens), so a burst overshoots a limit by at most one
reservation. Settling returns what the request did not use. A budget works the same way: a
request is admitted while ``spent + held < budget`` and holds its worst-case cost until it
settles with the real one. A budget with a period (``periods.py``) starts over when the period
named in ``Limits.period`` changes: the spent figure is then the ledger's for the new period.
A request refused while only the holds of requests in flight fill the budget is told so
(``held``, with a retry time), not that the budget is spent.
``redis_limits.py`` runs the same arithmetic atomically in Redis.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, Protocol

Reason = Literal["requests", "tokens", "quota", "held"]

# How long a request refused because the budget is held by requests in flight is asked to wait:
# holds settle when those requests end, typically within seconds.
HELD_RETRY_SECONDS = 1.0


@dataclass(frozen=True)
class Limits:
    rpm: int | None = None
    tpm: int | None = None
    budget_nanos: int | None = None
    spent_nanos: int = 0  # what the database says was spent (seeds the shared figure)
    period: int = 0  # the budget period spent_nanos belongs to (periods.period_tag); 0: lifetime

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget_nanos is not None


@dataclass(frozen=True)
class Snapshot:
    """What the ``x-ratelimit-*`` headers say. Levels may be fractional; headers floor them."""

    rpm: int | None
    requests_left: float
    tpm: int | None
    tokens_left: float

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for kind, limit, left in (("requests", self.rpm, self.requests_left), ("tokens", self.tpm, self.tokens_left)):
            if limit is None:
                continue
            out[f"x-ratelimit-limit-{kind}"] = str(limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(left)))
            out[f"x-ratelimit-reset-{kind}"] = duration(max(0.0, limit - left) * 60.0 / limit)
        return out

    def anthropic_headers(self, now: datetime) -> dict[str, str]:
        """The same figures as Anthropic's door names them (``anthropic-ratelimit-*``, each
        reset an RFC 3339 time)."""
        out: dict[str, str] = {}
        for kind, limit, left in (("requests", self.rpm, self.requests_left), ("tokens", self.tpm, self.tokens_left)):
            if limit is None:
                continue
            reset = now + timedelta(seconds=max(0.0, limit - left) * 60.0 / limit)
            out[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
            out[f"anthropic-ratelimit-{kind}-remaining"] = str(max(0, math.floor(left)))
            out[f"anthropic-ratelimit-{kind}-reset"] = reset.isoformat(timespec="seconds").replace("+00:00", "Z")
        return out


def tighter(a: Snapshot, b: Snapshot) -> Snapshot:
    """Per kind, the snapshot with less room left (a key's and its team's): what the
    ``x-ratelimit-*`` headers of a key in a team say."""
    rpm, requests_left = a.rpm, a.requests_left
    if rpm is None or (b.rpm is not None and b.requests_left < requests_left):
        rpm, requests_left = b.rpm, b.requests_left
    tpm, tokens_left = a.tpm, a.tokens_left
    if tpm is None or (b.tpm is not None and b.tokens_left < tokens_left):
        tpm, tokens_left = b.tpm, b.tokens_left
    return Snapshot(rpm, requests_left, tpm, tokens_left)


@dataclass(frozen=True)
class Decision:
    admitted: bool
    snapshot: Snapshot
    reason: Reason | None = None
    retry_after: float = 0.0  # seconds until the refused limit has room again


class Limiter(Protocol):
    async def reserve(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision: ...

    async def settle(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        """``refund_tokens``: reserved minus used (negative when a request used more);
        ``requests``: request units to give back (a reservation undone, not a request ended)."""
        ...

    async def peek(self, key_id: str, limits: Limits) -> Snapshot: ...

    async def close(self) -> None: ...


class InstantLimiter(Limiter, Protocol):
    """A limiter whose calls never wait (in this process, or in memory shared by the workers):
    a request settles with it on the spot, with no task to run it."""

    def settle_now(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None: ...


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``1m30s``, ``2.5s``, ``20ms``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest_text = f"{rest:.3g}s" if rest else ""
    return f"{int(minutes)}m{rest_text}" if minutes else rest_text


@dataclass
class _Bucket:
    level: float
    at: float

    def refill(self, limit: int, now: float) -> None:
        self.level = min(float(limit), self.level + (now - self.at) * limit / 60.0)
        self.at = now

    def wait(self, limit: int, need: float) -> float:
        return max(0.0, (need - self.level) * 60.0 / limit)


@dataclass
class _KeyState:
    requests: _Bucket
    tokens: _Bucket
    spent: int = 0
    held: int = 0
    period: int = 0
    touched: float = field(default_factory=time.monotonic)


class LocalLimiter:
    """In-process limits: exact for one instance, per instance when several run."""

    def __init__(self, clock: object = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[str, _KeyState] = {}

    def _state(self, key_id: str, limits: Limits) -> _KeyState:
        now: float = self._clock()  # type: ignore[operator]
        state = self._keys.get(key_id)
        if state is None:
            if len(self._keys) > 100_000:
                self._evict(now)
            state = _KeyState(_Bucket(float(limits.rpm or 0), now), _Bucket(float(limits.tpm or 0), now))
            self._keys[key_id] = state
        if limits.rpm:
            state.requests.refill(limits.rpm, now)
        if limits.tpm:
            state.tokens.refill(limits.tpm, now)
        if state.period != limits.period:
            # A new period (or another kind of one): its spend so far is the ledger's. Holds of
            # requests still running carry over; they settle into the period they end in.
            state.period = limits.period
            state.spent = limits.spent_nanos
        else:
            state.spent = max(state.spent, limits.spent_nanos)
        state.touched = now
        return state

    def _evict(self, now: float) -> None:
        for key_id, state in list(self._keys.items()):
            if now - state.touched > 120 and not state.held:
                del self._keys[key_id]

    @staticmethod
    def _snapshot(state: _KeyState, limits: Limits) -> Snapshot:
        return Snapshot(limits.rpm, state.requests.level, limits.tpm, state.tokens.level)

    async def reserve(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision:
        return self.reserve_now(key_id, limits, tokens, cost_nanos)

    def reserve_now(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision:
        state = self._state(key_id, limits)
        if limits.budget_nanos is not None and state.spent + state.held >= limits.budget_nanos:
            if state.spent >= limits.budget_nanos:
                return Decision(False, self._snapshot(state, limits), "quota")
            return Decision(False, self._snapshot(state, limits), "held", HELD_RETRY_SECONDS)
        if limits.rpm and state.requests.level < 1:
            return Decision(False, self._snapshot(state, limits), "requests", state.requests.wait(limits.rpm, 1))
        if limits.tpm and state.tokens.level <= 0:
            wait = state.tokens.wait(limits.tpm, 1)
            return Decision(False, self._snapshot(state, limits), "tokens", wait)
        if limits.rpm:
            state.requests.level -= 1
        if limits.tpm:
            state.tokens.level -= tokens
        if limits.budget_nanos is not None:
            state.held += cost_nanos
        return Decision(True, self._snapshot(state, limits))

    async def settle(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        self.settle_now(key_id, limits, refund_tokens, hold_nanos, cost_nanos, requests)

    def settle_now(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        state = self._state(key_id, limits)
        if limits.rpm and requests:
            state.requests.level = min(float(limits.rpm), state.requests.level + requests)
        if limits.tpm:
            state.tokens.level = min(float(limits.tpm), state.tokens.level + refund_tokens)
        if limits.budget_nanos is not None:
            state.held = max(0, state.held - hold_nanos)
            state.spent += cost_nanos

    async def peek(self, key_id: str, limits: Limits) -> Snapshot:
        return self._snapshot(self._state(key_id, limits), limits)

    async def close(self) -> None:
        return None
