"""What one check ends in, and the two ways a check stops early."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"
    INFO = "INFO"  # a figure that is reported, never judged (latency)


@dataclass(frozen=True)
class Result:
    group: str
    check: str
    status: Status
    detail: str = ""  # the reason for FAIL and SKIP, a figure for INFO, a note for PASS
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "check": self.check,
            "status": self.status.value,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


class Failed(Exception):
    """The endpoint broke the contract; the message is the one-line reason."""


class Skipped(Exception):
    """The check does not apply to this endpoint; the message says why, for the user."""


class Info(Exception):
    """A figure to report, not to judge."""


def expect(condition: bool, reason: str) -> None:
    if not condition:
        raise Failed(reason)
