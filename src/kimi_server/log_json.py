"""The server's log: one JSON object per line, on stderr.

Every line has ``ts`` (ISO 8601, UTC, milliseconds), ``level``, ``logger`` and ``message``;
a line logged as a ``Fields`` mapping (the per-request line) carries its fields at the top
level, encoded once. uvicorn's own lines go through the same formatter and its access line
is off: the request line says more (ids, key, model, tokens, timings).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

# ASCII only: a bidi override or control character in a logged value is escaped, not written.
_compact = json.JSONEncoder(separators=(",", ":"), default=str).encode


class Fields(dict[str, Any]):
    """A log message that is a set of fields; ``str()`` gives them as JSON, so a handler that
    is not this module's (pytest's capture, a library's) still sees one JSON object."""

    def __str__(self) -> str:
        return _compact(self)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        if isinstance(record.msg, Fields) and not record.args:
            line.update(record.msg)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _compact(line)


class CurrentStderr(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is at each line, not as it was when logging was set up:
    a caller that swaps the stream for a while (a CLI test runner) must not leave the log
    pointing at a closed file."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def log_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for this process and each uvicorn worker."""
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"stderr": {"class": f"{__name__}.CurrentStderr", "formatter": "json"}},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            # uvicorn's start-up and error lines reach the root's handler, formatted as JSON.
            "uvicorn": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level, "propagate": True},
            "uvicorn.access": {"handlers": [], "propagate": False},
            # Its debug lines carry every statement's values: captured prompts, ledger rows.
            "aiosqlite": {"handlers": [], "level": "INFO", "propagate": True},
        },
    }


def configure(level: str) -> None:
    """This process logs as JSON from here on (uvicorn applies ``log_config`` again in workers)."""
    import logging.config

    logging.config.dictConfig(log_config(level))
    logging.captureWarnings(True)  # Python warnings as log lines too, not bare text
