"""Tables. Secrets are never stored: a key row holds only the SHA-256 digest of its secret.

Money is integer nano-dollars (``*_nanos``): exact, and summable by any database.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Float, Index, Integer, String, Text
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

    # A key's spend in its budget period is summed from its rows since the period began.
    __table_args__ = (Index("ix_usage_key_created", "key_id", "created_at"),)


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
