"""Connection timeouts uvicorn lacks: a request head must arrive within a deadline.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``), but a connection that sends
nothing, or dribbles its headers a byte at a time, is held open forever. This protocol arms a
timer when a connection opens and after each response; it is disarmed once a request's head is
complete, and closes the connection when it fires first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from kimi_server.settings import Settings


class HeadDeadlineH11(H11Protocol):
    header_timeout: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._armed_for: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._armed_for:
            self._disarm()  # a new request cycle began: its head is complete

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._between_requests():
            self._arm()  # the next request's head must come in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._armed_for = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.cycle is self._armed_for and self._between_requests() and not self.transport.is_closing():
            self.transport.close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` that bound idle and slow connections."""
    protocol = type("KimiH11", (HeadDeadlineH11,), {"header_timeout": settings.http_header_timeout})
    return {"http": protocol, "timeout_keep_alive": settings.http_keep_alive_timeout}
