"""Logging an unexpected failure without the client's text.

An exception's message can quote what a client sent (a decode error shows the bytes, a
KeyError the key), so failures are logged as their type and where they happened, never their
message. The traceback's frames are the server's own source lines.
"""

from __future__ import annotations

import logging
import traceback


def log_failure(log: logging.Logger, what: str, exc: BaseException) -> None:
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error("%s: %s (message withheld: it may quote the request)\n%s", what, type(exc).__name__, frames)
