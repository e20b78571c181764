"""A circuit breaker per upstream: stop sending to one that keeps failing, probe it later.

closed: requests flow; ``threshold`` consecutive failures open it.
open: requests skip this upstream until ``cooldown`` seconds have passed.
half-open: one probe request goes through; success closes the breaker, failure opens it again
for another cooldown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(self, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        # Called when the breaker opens from closed (not when a failed probe opens it again):
        # the operator's alert (gate/operator_alerts.py). It must not block.
        self.on_open: Callable[[], None] | None = None

    @property
    def state(self) -> State:
        if self._opened_at is None:
            return "closed"
        if self._probing or self._clock() - self._opened_at >= self.cooldown:
            return "half_open"
        return "open"

    def allow(self) -> bool:
        """Whether a request may go to this upstream now (claims the probe when half-open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probing:
            self._probing = True
            return True
        return False

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        self._failures += 1
        if self._probing or self._failures >= self.threshold:
            was_closed = self._opened_at is None
            self._opened_at = self._clock()
            self._probing = False
            if was_closed and self.on_open is not None:
                self.on_open()

    def release(self) -> None:
        """A request that ended neither way (the client left): free the probe, keep the state."""
        self._probing = False
