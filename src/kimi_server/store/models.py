"""Tables. Secrets are never stored: a key row holds only the SHA-256 digest of its secret.

Money is integer nano-dollars (``*_nanos``): exact, and summable by any database.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Float, Index, Integer, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    budget_nanos: Mapped[int | None] = mapped_column(BigInteger)
    spent_nanos: Mapped[int] = mapped_column(BigInteger, default=0)
    models: Mapped[str | None] = mapped_column(Text)  # comma-separated model ids; None: all
    # daily | weekly | monthly: the budget starts over each period (UTC); None: a lifetime budget.
    budget_period: Mapped[str | None] = mapped_column(String(8))
    # Spend in a period past which the operator's webhook is told, once (gate/budget_alerts.py).
    soft_budget_nanos: Mapped[int | None] = mapped_column(BigInteger)
    # Output tokens of a request that names no cap; None: the model's default (settings).
    max_output_tokens: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Prompts and answers of this key's requests are kept (the captures table) while true.
    capture: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    team_id: Mapped[str | None] = mapped_column(String(32), index=True)  # teams.id; None: no team
    tags: Mapped[str | None] = mapped_column(Text)  # comma-separated, for cost attribution
    # After a rotation, the replaced secret's digest, accepted until previous_expires_at.
    previous_digest: Mapped[str | None] = mapped_column(String(64), index=True)
    previous_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TeamRow(Base):
    """Keys grouped under one budget, one set of limits and one list of models, which bound
    every key of the team (``gate/teams.py``)."""

    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    budget_nanos: Mapped[int | None] = mapped_column(BigInteger)
    spent_nanos: Mapped[int] = mapped_column(BigInteger, default=0)  # every key's, all time
    budget_period: Mapped[str | None] = mapped_column(String(8))
    soft_budget_nanos: Mapped[int | None] = mapped_column(BigInteger)
    models: Mapped[str | None] = mapped_column(Text)
    capture: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class UsageRow(Base):
    __tablename__ = "usage"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    client_request_id: Mapped[str | None] = mapped_column(String(128))
    key_id: Mapped[str] = mapped_column(String(32), index=True)
    model: Mapped[str] = mapped_column(String(100))
    endpoint: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(20))  # completed | cancelled | failed
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    cache_write_tokens: Mapped[int] = mapped_column(Integer)
    cache_ttl: Mapped[str] = mapped_column(String(8))
    reasoning_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    # engine | server_count | server_estimate: who counted the tokens (engines/types.py UsageSource)
    usage_source: Mapped[str] = mapped_column(String(16), server_default="engine")
    web_search_calls: Mapped[int] = mapped_column(Integer)
    cost_nanos: Mapped[int] = mapped_column(BigInteger)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    duration_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # The client's own name for its end user (chat's ``user``, Messages' ``metadata.user_id``).
    end_user: Mapped[str | None] = mapped_column(String(256))
    # stop | length | tool_calls, as the engine ended; None: it did not end (cut off, failed).
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String(64))  # a failed request's error code
    team_id: Mapped[str | None] = mapped_column(String(32))  # the key's team when it ran

    # A key's (and a team's) spend in its budget period is summed from its rows since it began.
    __table_args__ = (
        Index("ix_usage_key_created", "key_id", "created_at"),
        Index("ix_usage_team_created", "team_id", "created_at"),
    )


class CaptureRow(Base):
    """A request's prompt and answer, kept only for keys or teams that capture, and deleted
    after ``capture_retention_days`` (``gate/captures.py``)."""

    __tablename__ = "captures"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    prompt: Mapped[str] = mapped_column(Text)  # JSON: the messages as the engine got them
    reasoning: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    tool_calls: Mapped[str] = mapped_column(Text)  # JSON: [{id, name, arguments}]


class AuditRow(Base):
    """One administrative action: who did it, from where, and what changed (never a secret)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    surface: Mapped[str] = mapped_column(String(16))  # admin_api | console | cli
    who: Mapped[str] = mapped_column(String(200))  # the credential, named without its secret
    address: Mapped[str | None] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(40))  # key.create, team.update, console.sign_in...
    target: Mapped[str | None] = mapped_column(String(64))  # the key's or team's id
    details: Mapped[str] = mapped_column(Text)  # JSON: what changed


class BudgetAlertRow(Base):
    """One per key and budget period whose spend crossed the key's soft budget: the row is
    claimed before the webhook is called, so no restart or other instance sends it again."""

    __tablename__ = "budget_alerts"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    soft_budget_nanos: Mapped[int] = mapped_column(BigInteger)
    spent_nanos: Mapped[int] = mapped_column(BigInteger)  # the period's spend when it was seen
    crossed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(String(200))
