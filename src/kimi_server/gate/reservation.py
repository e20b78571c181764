"""What the gateway reserved for one admitted request: the key's limits as they stood, the
tokens and money held against them, and what the ledger row will need (``gate/metering.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kimi_server.gate.limits import Limits


@dataclass
class Reservation:
    request_id: str
    client_request_id: str | None
    key_id: str
    stored_key: bool
    limits: Limits
    model: str
    endpoint: str
    cache_ttl: str
    prompt_estimate: int
    reserved_tokens: int
    hold_nanos: int
    started: float = field(default_factory=time.monotonic)
    reserved: bool = False
    budget_period: str | None = None  # the key's budget period (None: lifetime)
    soft_budget_nanos: int | None = None  # the key's soft budget, checked when the request ends
    end_user: str | None = None  # the client's own name for its end user (the ledger's end_user)
    # The key's team, whose limits and budget the request also holds (None: no team).
    team_id: str | None = None
    team_limits: Limits | None = None
    team_reserved: bool = False
    team_budget_period: str | None = None
    team_soft_budget_nanos: int | None = None
    capture: bool = False  # keep the prompt and the answer (the key's or its team's switch)
