"""How long a request body may take: a total deadline, and a minimum average rate.

The clock counts only time the server was ready to read (``http/connections.py`` leaves out
time while reading is paused because the application has not taken what arrived yet), so a
slow application never makes a fast client look slow.
"""

from __future__ import annotations

from dataclasses import dataclass

CHECK_EVERY = 1.0  # seconds between checks; also how finely waiting time is told apart


@dataclass(frozen=True)
class BodyPace:
    timeout: float  # seconds for the whole body
    min_rate: float  # bytes per second the body must average once the grace is over; 0: off
    grace: float  # seconds before the minimum rate applies

    def broken(self, elapsed: float, received: int) -> bool:
        """Whether a body that has taken ``elapsed`` seconds for ``received`` bytes so far
        has missed its deadline or fallen under the minimum rate."""
        if elapsed >= self.timeout:
            return True
        if self.min_rate <= 0 or elapsed <= self.grace:
            return False
        return received < self.min_rate * (elapsed - self.grace)

    def next_check(self, elapsed: float) -> float:
        """Seconds until the next check: at most ``CHECK_EVERY``, never past the deadline."""
        return max(0.01, min(CHECK_EVERY, self.timeout - elapsed))
