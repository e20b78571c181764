"""Connection caps: in all and per client address, sized from the descriptor limit.

Every open connection holds a file descriptor. Past the caps a new connection is answered
503 at once and closed, so the process never runs out of descriptors (which would stall
every client, and the database and model files too).
"""

from __future__ import annotations

import resource
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kimi_server.settings import Settings

# Descriptors kept back from the caps for everything that is not a client connection:
# database and Redis pools, model files, upstream connection pools, logs.
RESERVED_DESCRIPTORS = 128
HIGHEST_SOFT_LIMIT = 1 << 20  # what Linux allows by default (fs.nr_open)
MAX_BACKLOG = 2048  # uvicorn's default listen backlog


def raise_descriptor_limit() -> int:
    """Raises the soft descriptor limit to the hard one where allowed; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = HIGHEST_SOFT_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        except (ValueError, OSError):
            pass  # not allowed here: the caps follow the limit as it is
    return HIGHEST_SOFT_LIMIT if soft == resource.RLIM_INFINITY else soft


@dataclass(frozen=True)
class ConnectionCaps:
    total: int
    per_address: int  # 0: no per-address cap (behind a proxy every client has its address)
    lingering: int  # turned-away connections left open a moment so that their 503 is read
    # asyncio accepts up to the listen backlog in one go, before any connection is looked at:
    # the descriptors a burst can take at once, beyond the caps.
    backlog: int

    @classmethod
    def from_settings(cls, settings: Settings, descriptors: int) -> ConnectionCaps:
        """Unset caps come from the descriptor limit: half of what is left after a reserve in
        all, and a quarter of that per address. The rest absorbs bursts: a few accepted
        batches of turned-away connections are in flight before they are closed."""
        usable = max(64, descriptors - RESERVED_DESCRIPTORS)
        total = settings.http_max_connections or usable // 2
        per_address = settings.http_max_connections_per_ip
        if per_address is None:
            per_address = max(1, total // 4)
        lingering = max(8, total // 8)
        backlog = min(MAX_BACKLOG, max(16, (usable - total - lingering) // 4))
        return cls(total=total, per_address=per_address, lingering=lingering, backlog=backlog)


class ConnectionGate:
    """Counts open connections, in all and per address; one per listening server."""

    def __init__(self, caps: ConnectionCaps, on_turn_away: Callable[[], None] | None = None) -> None:
        self.caps = caps
        self.on_turn_away = on_turn_away
        self._open = 0
        self._by_address: Counter[str] = Counter()
        # A few at most linger, so that a flood cannot take the descriptors the caps keep free.
        self._lingering = 0

    @property
    def open(self) -> int:
        return self._open

    def enter(self, address: str | None) -> str | None:
        """Takes a place for a new connection. Past a cap nothing is taken, and the cap is
        named for the client's answer."""
        refused = None
        if self._open >= self.caps.total:
            refused = f"at most {self.caps.total} in all"
        elif address is not None and self.caps.per_address and self._by_address[address] >= self.caps.per_address:
            refused = f"at most {self.caps.per_address} from one address"
        if refused is not None:
            if self.on_turn_away is not None:
                self.on_turn_away()
            return refused
        self._open += 1
        if address is not None:
            self._by_address[address] += 1
        return None

    def leave(self, address: str | None) -> None:
        self._open -= 1
        if address is not None:
            self._by_address[address] -= 1
            if self._by_address[address] <= 0:
                del self._by_address[address]

    def start_lingering(self) -> bool:
        """Takes a place for a turned-away connection to linger; False when none is left."""
        if self._lingering >= self.caps.lingering:
            return False
        self._lingering += 1
        return True

    def stop_lingering(self) -> None:
        self._lingering -= 1
