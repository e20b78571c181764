"""Captured prompts and answers: kept only for keys or teams that ask for it, in their own table
keyed by request id, and deleted once older than ``capture_retention_days``.

A capture is written off the request (a task the gateway waits for at shutdown), never to the
log. What is kept is bounded: the last ``MAX_MESSAGES`` messages, each text cut at
``MAX_TEXT_CHARS``; images and videos are counted, not kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete

from kimi_server.engines.types import Message
from kimi_server.store.db import Database, utc
from kimi_server.store.models import CaptureRow

log = logging.getLogger(__name__)
MAX_MESSAGES = 200
MAX_TEXT_CHARS = 100_000
PRUNE_EVERY = 3600.0  # seconds between deletions of old captures
Spawn = Callable[[Coroutine[Any, Any, None]], object]


def clean(text: str) -> str:
    """Text any database keeps (PostgreSQL's holds no NUL), cut at ``MAX_TEXT_CHARS``."""
    text = text.replace("\x00", "\ufffd")
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + " [cut]"


def message_view(m: Message) -> dict[str, Any]:
    shown: dict[str, Any] = {"role": m.role, "text": clean(m.text)}
    if m.reasoning:
        shown["reasoning"] = clean(m.reasoning)
    if m.tool_calls:
        shown["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": clean(c.arguments)} for c in m.tool_calls]
    for name in ("tool_call_id", "name"):
        if getattr(m, name):
            shown[name] = getattr(m, name)
    if m.images:
        shown["images"] = len(m.images)
    if m.videos:
        shown["videos"] = len(m.videos)
    return shown


@dataclass
class Capture:
    """One request's prompt and answer as they accumulate over its engine calls."""

    request_id: str
    key_id: str
    created_at: datetime
    prompt: list[dict[str, Any]] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    # A request that calls the engine again saves again: one save at a time, the last one whole.
    saving: asyncio.Lock = field(default_factory=asyncio.Lock)

    def row(self) -> CaptureRow:
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return CaptureRow(
            request_id=self.request_id,
            key_id=self.key_id,
            created_at=self.created_at,
            prompt=json.dumps(self.prompt, ensure_ascii=False),
            reasoning=clean("".join(self.reasoning)),
            answer=clean("".join(self.answer)),
            tool_calls=json.dumps(calls, ensure_ascii=False).replace("\\u0000", "\ufffd"),
        )


class CaptureStore:
    def __init__(self, db: Database, retention_days: int, spawn: Spawn, clock: Callable[[], datetime]) -> None:
        self.db = db
        self.retention = timedelta(days=retention_days)
        self.spawn = spawn  # runs work off the request; the gateway waits for it at shutdown
        self.clock = clock
        self._pruned = 0.0

    async def save(self, capture: Capture) -> None:
        """Writes (or rewrites: a request that called the engine again) the capture."""
        try:
            async with capture.saving, self.db.sessions() as session:
                await session.merge(capture.row())
                await session.commit()
        except Exception as exc:  # the request has ended: its capture is lost, nothing else
            log.warning("capture of request %s not written: %s", capture.request_id, type(exc).__name__)
        if time.monotonic() - self._pruned > PRUNE_EVERY:
            await self.prune()

    async def prune(self) -> int:
        """Deletes captures past the retention period; how many."""
        self._pruned = time.monotonic()
        cutoff = self.clock() - self.retention
        async with self.db.sessions() as session:
            result = await session.execute(delete(CaptureRow).where(CaptureRow.created_at < cutoff))
            await session.commit()
        return int(getattr(result, "rowcount", 0) or 0)

    async def get(self, request_id: str) -> dict[str, Any] | None:
        return await load_capture(self.db, request_id)

    def start(self, request_id: str, key_id: str, messages: tuple[Message, ...]) -> Capture:
        kept = messages[-MAX_MESSAGES:]
        return Capture(request_id, key_id, self.clock().astimezone(UTC), [message_view(m) for m in kept])


async def load_capture(db: Database, request_id: str) -> dict[str, Any] | None:
    """A request's captured prompt and answer; None where none was kept."""
    async with db.sessions() as session:
        row = await session.get(CaptureRow, request_id)
    if row is None:
        return None
    return {
        "request_id": row.request_id,
        "created_at": (utc(row.created_at) or row.created_at).isoformat(),
        "prompt": json.loads(row.prompt),
        "reasoning": row.reasoning,
        "answer": row.answer,
        "tool_calls": json.loads(row.tool_calls),
    }
