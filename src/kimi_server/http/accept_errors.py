"""One log line per interval for failed ``accept()`` calls, instead of one per call.

When the process runs out of descriptors, asyncio logs every failed ``accept()`` with a
traceback, and (Python 3.11) retries up to the listen backlog each second: tens of
thousands of lines a minute, which fill the disk while the server is already in trouble.
This filter on the ``asyncio`` logger lets the first failure through as one line, then one
line per interval with the count of failures folded into it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's own message
# Each failure also schedules a retry; those still pending when the server closes fail again.
RETRY_FAILED = "Exception in callback BaseSelectorEventLoop._start_serving"
INTERVAL = 10.0  # seconds between two lines


class AcceptErrorDigest(logging.Filter):
    def __init__(self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._folded = 0  # failures not logged since the last line
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if not message.startswith((ACCEPT_FAILED, RETRY_FAILED)):
            return True
        now = self.clock()
        with self._lock:
            if message.startswith(RETRY_FAILED) or (self._last is not None and now - self._last < self.interval):
                self._folded += 1
                return False
            folded, self._folded, self._last = self._folded, 0, now
        exc = record.exc_info[1] if record.exc_info else None
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "out of resources"
        record.msg = (
            "accept() failed: %s (%d more failures since the last line); new connections wait until descriptors free up"
        )
        record.args = (reason, folded)
        record.exc_info = None
        record.exc_text = None
        return True


_installed: AcceptErrorDigest | None = None


def install_accept_error_digest() -> None:
    """Adds the filter to the ``asyncio`` logger, once per process."""
    global _installed
    if _installed is None:
        _installed = AcceptErrorDigest()
        logging.getLogger("asyncio").addFilter(_installed)
