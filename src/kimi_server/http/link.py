"""The client's connection as the pipeline sees it (``gate/admit.py:ClientLink``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request

from kimi_server.http.disconnect import until_disconnected

T = TypeVar("T")


class HttpLink:
    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request

    async def until_gone(self, work: Awaitable[T], discard: Callable[[T], object] | None = None) -> T:
        return await until_disconnected(self.request, work, discard)
