"""The request's own record, which the middleware opens (``http/request_context.py``), the guard
and the gateway fill in, and the request log and the response headers read."""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from kimi_server.gate.auth import Principal
from kimi_server.gate.limits import Snapshot

RECORD = "kimi.request"  # the ASGI scope key of the request's record


@dataclass
class RequestRecord:
    request_id: str  # the server's own id, for the ledger and the log
    client_request_id: str | None = None  # the client's x-request-id, when it is sane
    principal: Principal | None = None  # set once, by the guard that checked the key
    key_id: str | None = None  # for the log line (gateway keys)
    model: str | None = None  # the model admitted, for the metrics and the log
    ratelimit_headers: dict[str, str] | None = None  # x-ratelimit-* (and retry-after on a 429)
    ratelimit: Snapshot | None = None  # the figures behind them, for the other door's names
    usage: dict[str, Any] | None = None  # the ledger row, for the log line


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def request_record(scope: MutableMapping[str, Any]) -> RequestRecord:
    """The request's record; one is opened here where no middleware opened it (an app built
    without ``RequestContext``)."""
    record = scope.get(RECORD)
    if not isinstance(record, RequestRecord):
        record = RequestRecord(new_request_id())
        scope[RECORD] = record
    return record
