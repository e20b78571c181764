"""Admission control: a bounded queue in front of an engine, served fairly across API keys.

An engine runs at most ``slots`` generations at once. Requests beyond that wait here, in the
server's own queue, instead of inside llama.cpp (whose queue is unbounded and first come, first
served). When a slot frees, the next request comes from the waiting key that holds the fewest
slots, ties going round-robin, so one key's burst cannot push every other key to the back.

Bounds: ``max_queue`` waiting requests in all (503 past it), ``max_queue_per_key`` waiting
requests per key (429: that key is over its share), and ``max_wait`` seconds of waiting (503
instead of starting late). Once enough requests have finished to know how long one holds its
slot, a request whose predicted wait is past ``max_wait`` gets that 503 at once instead of after
waiting for it. Every refusal carries ``Retry-After``.

Use::

    place = await admission.admit(key_id)   # may raise OverloadedError / KeyOverShareError
    try:
        ...generate...
    finally:
        place.release()                     # idempotent

or ``async with admission.slot(key_id): ...``.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import statistics
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from kimi_server.errors import EngineUnavailableError, RateLimitError


class OverloadedError(EngineUnavailableError):
    """503: the queue is full, or the request waited longer than the server allows."""

    default_code = "server_overloaded"

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(message, code=code, retry_after=retry_after)


class KeyOverShareError(RateLimitError):
    """429: this key already has as many requests waiting as one key may."""

    default_code = "too_many_queued_requests"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)


@dataclass(frozen=True)
class AdmissionLimits:
    slots: int  # generations admitted at once: the engine's generation slots
    max_queue: int = 64
    max_queue_per_key: int = 32
    max_wait: float = 30.0


@dataclass
class AdmissionCounters:
    admitted: int = 0  # requests that got a slot (at once or after waiting)
    queued: int = 0  # of those, requests that had to wait first
    rejected_queue_full: int = 0  # 503
    rejected_key_share: int = 0  # 429
    timed_out: int = 0  # 503 after max_wait
    refused_early: int = 0  # 503 at once: its predicted wait was past max_wait
    left_while_waiting: int = 0  # the client went away before a slot was free


@dataclass(eq=False)
class QueuePlace:
    """One admitted request's hold on a slot; ``release`` gives it back (once)."""

    admission: Admission
    key_id: str
    granted_at: float
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release(self)


@dataclass(eq=False)
class _Waiter:
    key_id: str
    future: asyncio.Future[QueuePlace] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def next_key(rotation: Iterable[str], active: Mapping[str, int]) -> str:
    """The fair order: of the waiting keys (in rotation order), the one holding the fewest
    slots; the earliest in the rotation on a tie."""
    return min(rotation, key=lambda k: active.get(k, 0))


# Finished requests needed before a predicted wait may refuse one: a cold server's first
# few durations say little about the next.
PREDICTION_EVIDENCE = 8


class Admission:
    def __init__(self, limits: AdmissionLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._active: Counter[str] = Counter()  # key id -> slots held
        self._waiting: OrderedDict[str, deque[_Waiter]] = OrderedDict()  # rotation order
        self._total = AdmissionCounters()
        self._by_key: dict[str, AdmissionCounters] = {}
        # Recent waits for a slot, and how long admitted requests held theirs: Retry-After.
        self._wait_seconds: deque[float] = deque(maxlen=64)
        self._held_seconds: deque[float] = deque(maxlen=64)
        self._holding: set[QueuePlace] = set()  # the places held now: their ages count on a cold server

    # -- figures --------------------------------------------------------------------------

    @property
    def active(self) -> int:
        return sum(self._active.values())

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def key_stats(self, key_id: str) -> dict[str, int]:
        """One key's own figures (what a tenant may see)."""
        counters = self._by_key.get(key_id, AdmissionCounters())
        return {
            "admitted_requests": self._active[key_id],
            "queued_requests": len(self._waiting.get(key_id, ())),
            **{f"{name}": value for name, value in vars(counters).items()},
        }

    def totals(self) -> dict[str, int]:
        """Server-wide figures, for operators only."""
        return {
            "slots": self.limits.slots,
            "admitted_requests": self.active,
            "queued_requests": self.waiting,
            "queue_max": self.limits.max_queue,
            **vars(self._total),
        }

    # -- admission ------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, key_id: str) -> AsyncIterator[QueuePlace]:
        place = await self.admit(key_id)
        try:
            yield place
        finally:
            place.release()

    def admit_now(self, key_id: str) -> QueuePlace | None:
        """A place at once when a place is free and nobody waits; None when the request must queue."""
        if self.active < self.limits.slots and not self._waiting:
            return self._grant(key_id, waited=False)
        return None

    async def admit(self, key_id: str) -> QueuePlace:
        place = self.admit_now(key_id)
        if place is not None:
            return place
        queued = self._waiting.get(key_id)
        if queued is not None and len(queued) >= self.limits.max_queue_per_key:
            self._count(key_id, "rejected_key_share")
            raise KeyOverShareError(
                "Too many requests from this API key are already waiting for the model. "
                "Retry after the time in the Retry-After header, or send fewer at once.",
                retry_after=self._retry_after(),
            )
        if self.waiting >= self.limits.max_queue:
            self._count(key_id, "rejected_queue_full")
            raise OverloadedError(
                "The server is overloaded: its queue is full. Retry after the time in the Retry-After header.",
                retry_after=self._retry_after(),
            )
        predicted = self.predicted_wait(key_id)
        if predicted is not None and predicted > self.limits.max_wait:
            self._count(key_id, "refused_early")
            raise OverloadedError(
                f"The request would wait about {math.ceil(predicted)} s for the model, past the server's "
                f"limit of {self.limits.max_wait:g} s, so it was not queued. Retry after the time in "
                "the Retry-After header.",
                retry_after=max(1, math.ceil(predicted - self.limits.max_wait)),
                code="queue_timeout",
            )
        waiter = _Waiter(key_id)
        self._waiting.setdefault(key_id, deque()).append(waiter)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            place = await asyncio.wait_for(asyncio.shield(waiter.future), self.limits.max_wait)
        except TimeoutError:
            if self._withdraw(waiter):
                self._count(key_id, "timed_out")
                raise OverloadedError(
                    f"The request waited {self.limits.max_wait:g} s for the model without "
                    "starting, so it was not run. Retry after the time in the Retry-After header.",
                    retry_after=self._retry_after(),
                    code="queue_timeout",
                ) from None
            place = waiter.future.result()  # granted in the same instant: keep it
        except asyncio.CancelledError:
            if not self._withdraw(waiter) and waiter.future.done() and not waiter.future.cancelled():
                waiter.future.result().release()  # granted just as the client left
            self._count(key_id, "left_while_waiting")
            raise
        self._wait_seconds.append(loop.time() - started)
        return place

    def _grant(self, key_id: str, *, waited: bool) -> QueuePlace:
        self._active[key_id] += 1
        self._count(key_id, "admitted")
        if waited:
            self._count(key_id, "queued")
        place = QueuePlace(self, key_id, granted_at=self._clock())
        self._holding.add(place)
        return place

    def _withdraw(self, waiter: _Waiter) -> bool:
        """Takes a waiter out of the queue; False if it was already granted."""
        queue = self._waiting.get(waiter.key_id)
        if queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        if not queue:
            del self._waiting[waiter.key_id]
        return True

    def _release(self, place: QueuePlace) -> None:
        self._held_seconds.append(self._clock() - place.granted_at)
        self._holding.discard(place)
        self._active[place.key_id] -= 1
        if self._active[place.key_id] <= 0:
            del self._active[place.key_id]
        self._dispatch()

    def _dispatch(self) -> None:
        while self.active < self.limits.slots and self._waiting:
            key_id = self._next_key()
            queue = self._waiting[key_id]
            waiter = queue.popleft()
            # Round-robin: the key served goes to the back of the rotation.
            del self._waiting[key_id]
            if queue:
                self._waiting[key_id] = queue
            if waiter.future.done():  # cancelled meanwhile
                continue
            waiter.future.set_result(self._grant(key_id, waited=True))

    def _next_key(self) -> str:
        return next_key(self._waiting, self._active)

    def _count(self, key_id: str, name: str) -> None:
        for counters in (self._total, self._by_key.setdefault(key_id, AdmissionCounters())):
            setattr(counters, name, getattr(counters, name) + 1)

    def _retry_after(self) -> int:
        """Seconds until a retry has a fair chance, from what was measured: the typical recent
        wait, or the queue ahead served at the typical time a request holds its slot, whichever
        is longer. The slots held now count as well, by how long they have been held so far: a
        cold server that has finished nothing yet still knows its requests take at least that
        long. At least one; at most ``max_wait``, since nothing waits longer than that."""
        waited = statistics.median(self._wait_seconds) if self._wait_seconds else 0.0
        held = statistics.median(self._held_seconds) if self._held_seconds else 0.0
        if self._holding:
            now = self._clock()
            held = max(held, statistics.median(now - place.granted_at for place in self._holding))
        turns = max(1, math.ceil(self.waiting / self.limits.slots))
        estimate = max(waited, held * turns)
        return min(max(1, math.ceil(estimate)), max(1, math.ceil(self.limits.max_wait)))

    def predicted_wait(self, key_id: str) -> float | None:
        """Seconds a request of ``key_id`` arriving now would wait for a slot, or None while too
        few requests have finished to say. The fair order (``_dispatch``) is replayed: each
        request holding a slot gives it back once it has held it the median time a request
        holds one, and whoever the order serves next holds it that long again."""
        if len(self._held_seconds) < PREDICTION_EVIDENCE:
            return None
        held = statistics.median(self._held_seconds)
        now = self._clock()
        # (when a slot frees, the key holding it); a slot nobody holds frees now
        frees = [(max(0.0, held - (now - place.granted_at)), place.key_id) for place in self._holding]
        frees += [(0.0, "")] * max(0, self.limits.slots - len(frees))
        heapq.heapify(frees)
        active = Counter(self._active)
        queued = OrderedDict((key, len(queue)) for key, queue in self._waiting.items())
        queued[key_id] = queued.get(key_id, 0) + 1  # a new key joins the rotation at its end
        while True:
            at, holder = heapq.heappop(frees)
            active[holder] -= 1
            key = next_key(queued, active)
            left = queued.pop(key) - 1
            if key == key_id and left == 0:
                return at
            if left:
                queued[key] = left  # served: to the back of the rotation
            active[key] += 1
            heapq.heappush(frees, (at + held, key))
