"""The provider interface and the shapes every provider returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class SearchOutcome:
    """What one search produced. ``error`` is set (and ``hits`` empty) when it failed: a failed
    search is still an answer the model can read, never an HTTP error."""

    query: str
    hits: tuple[SearchHit, ...] = ()
    error: str | None = None


class SearchProvider(Protocol):
    name: str

    async def search(self, query: str, limit: int) -> SearchOutcome: ...


class SearchFailed(Exception):
    """A provider could not answer; the message is safe to show the model."""
