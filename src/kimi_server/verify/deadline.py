"""Wall-clock deadlines: one per check, one per request.

An HTTP client's timeouts bound each socket operation, so an endpoint that keeps sending (an
endless stream, a body trickled a byte at a time) is never timed out by them. A run instead
gives each check a deadline (``--check-timeout``) and each request one (``--timeout``); the
transport (``verify/transport.py``) holds every socket operation of a request to the earlier of
the two, so no answer can outlast them, however it arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    seconds: float  # as given, for messages
    at: float  # time.monotonic() by which the work must be done

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(seconds, time.monotonic() + seconds)

    def left(self) -> float:
        return self.at - time.monotonic()


class DeadlinePassed(TimeoutError):
    """A wait inside a check (for an answer another check is fetching) outlasted its deadline."""


# The deadline of the check running in this thread (checks run one per worker thread).
_check: ContextVar[Deadline | None] = ContextVar("verify_check_deadline", default=None)


@contextmanager
def check_deadline(seconds: float) -> Iterator[Deadline]:
    deadline = Deadline.after(seconds)
    token = _check.set(deadline)
    try:
        yield deadline
    finally:
        _check.reset(token)


def current_check() -> Deadline | None:
    return _check.get()


def request_deadline(seconds: float) -> Deadline:
    """A request starting now: its own deadline, or its check's where that comes first."""
    own = Deadline.after(seconds)
    check = current_check()
    return check if check is not None and check.at < own.at else own


def acquire(lock: threading.Lock) -> None:
    """Takes ``lock``, waiting no longer than the running check may."""
    check = current_check()
    if check is None:
        lock.acquire()
    elif not lock.acquire(timeout=max(check.left(), 0.0)):
        raise DeadlinePassed(f"waited past the {check.seconds:g} s check deadline")


def timed_out_reason(check: Deadline, request_seconds: float) -> str:
    """What a check that timed out is reported with: the deadline that ended it."""
    # Every socket operation is held to the earlier deadline; if the check's has not passed,
    # the request's did.
    if check.left() <= 0.01:
        return f"not finished within the {check.seconds:g} s check deadline (--check-timeout)"
    return f"no complete answer within the {request_seconds:g} s request deadline (--timeout)"
