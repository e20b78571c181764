"""Connection-level limits uvicorn lacks, in its HTTP/1.1 protocol (one object per connection).

Built on uvicorn's httptools protocol: its C parser costs a fraction of h11's pure-Python one
on every request head. The subclass reaches into that protocol's internals (``cycle``, ``flow``,
``pipeline``, ``scope``), which uvicorn does not promise to keep, so the server refuses to start
on any uvicorn but the one this was written and tested for (``check_uvicorn``).

- **Request head deadline.** uvicorn closes idle keep-alive connections, but a connection that
  sends nothing, or dribbles its headers a byte at a time, would be held open forever. A new
  connection, and one that starts a request head after a response, must complete that head
  within ``http_header_timeout``, or it is closed. A connection idle after a response is left
  to uvicorn's keep-alive timeout, which is longer than the idle expiry of common clients
  (httpx, thus the openai and anthropic SDKs: 5 s): the client ends an idle connection first,
  rather than reusing one the server is closing and losing the request it sent.
- **Body pace.** A body must be complete within ``http_body_timeout`` and, after a grace,
  average at least ``http_body_min_rate`` bytes/s (``http/body_pace.py``); otherwise 408 and
  the connection closes. Watched here, where every byte arrives, rather than in the
  application: a body nobody reads (after an early answer) is bounded too.
- **Connection caps.** Past ``http_max_connections`` in all or ``http_max_connections_per_ip``
  from one address, a new connection is answered 503 at once and closed
  (``http/connection_gate.py``), before the process runs out of descriptors.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kimi_server.errors import APIError, RequestTimeoutError
from kimi_server.gate.admission import OverloadedError
from kimi_server.http.accept_errors import install_accept_error_digest
from kimi_server.http.body_pace import BodyPace
from kimi_server.http.connection_gate import ConnectionCaps, ConnectionGate, raise_descriptor_limit
from kimi_server.http.disconnect import DISCONNECT, DisconnectWatch
from kimi_server.http.errors import error_headers
from kimi_server.settings import Settings

log = logging.getLogger("kimi_server.connections")
# The uvicorn whose HTTP protocol EdgeHttp was written against (pinned in pyproject.toml).
UVICORN_WRITTEN_FOR = "0.54.0"
BODY_TIMED_OUT = "kimi.body_timed_out"  # scope key: set when this protocol ended a slow body
TURNED_AWAY_RETRY_AFTER = 2  # seconds; connections free up as requests finish
LINGER = 2.0  # seconds a turned-away connection may take to read its 503 and close
TURNED_AWAY_LOG_INTERVAL = 10.0


def raw_response(error: APIError) -> bytes:
    """A complete HTTP/1.1 error response in the API's error shape, ending the connection."""
    body = json.dumps(error.to_body()).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **{name.lower(): value for name, value in error_headers(error).items()},
        "connection": "close",
    }
    status = HTTPStatus(error.status_code)
    head = f"HTTP/1.1 {status.value} {status.phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + body


@dataclass
class _BodyWatch:
    received: int  # body bytes so far
    checked_at: float  # loop time of the last check
    elapsed: float = 0.0  # seconds counted against the client (reading not held by the server)
    timer: asyncio.TimerHandle | None = None


class EdgeHttp(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_pace: BodyPace = BodyPace(timeout=60.0, min_rate=1024, grace=5.0)
    gate: ConnectionGate | None = None  # shared by every connection of one server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._armed_for: object = None
        self._head_started = False  # bytes of a request head came since the last response
        self._address: str | None = None
        self._admitted = False  # holds a place in the gate
        self._linger: asyncio.TimerHandle | None = None
        self._body: _BodyWatch | None = None
        self._body_cycle: object = None  # the request cycle whose body is (or was) watched

    # -- connection -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else None
        refused = self.gate.enter(self._address) if self.gate is not None else None
        if refused is not None:
            self._turn_away(refused)
            return
        self._admitted = True
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # turned away: whatever it sends is dropped while its 503 goes out
        watched = self._body is not None and self.cycle is self._body_cycle
        super().data_received(data)
        if watched and self._body is not None:
            self._body.received += len(data)
        if self._deadline is not None and self.cycle is not self._armed_for:
            self._disarm()  # a new request cycle began: its head is complete
        elif self._between_requests() and not self.transport.is_closing():
            self._head_started = True  # part of the next head: it must be complete in time
            if self._deadline is None:
                self._arm()
        self._follow_body()

    def on_headers_complete(self) -> None:
        # Before the request's task exists: it finds the watch in its scope from the start.
        cast(dict[str, Any], self.scope)[DISCONNECT] = DisconnectWatch()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._between_requests():
            self._head_started = False
            self._arm()  # a head started later (or already) must come in time too
        self._follow_body()  # a pipelined request may have started

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stop_body_watch()
        if self._linger is not None and self.gate is not None:
            self._linger.cancel()
            self._linger = None
            self.gate.stop_lingering()
        if self._admitted and self.gate is not None:
            self._admitted = False
            self.gate.leave(self._address)
        super().connection_lost(exc)
        self._tell_requests()

    def _tell_requests(self) -> None:
        """The requests still answering on this connection stop their work (``until_disconnected``)."""
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)]
        for cycle in cycles:
            if cycle is not None and cycle.disconnected:
                watch = cycle.scope.get(DISCONNECT)
                if isinstance(watch, DisconnectWatch):
                    watch.fire()

    def _turn_away(self, cap: str) -> None:
        error = OverloadedError(
            f"The server has too many open connections ({cap}). Retry after the time in the Retry-After header.",
            retry_after=TURNED_AWAY_RETRY_AFTER,
            code="too_many_connections",
        )
        self.transport.write(raw_response(error))
        # Half-close and drop what the client sends until it closes too: closing with its
        # request unread would reset the connection, and the client might lose the 503.
        # Under a flood there is no room for that: close at once.
        if self.gate is not None and self.transport.can_write_eof() and self.gate.start_lingering():
            self._linger = self.loop.call_later(LINGER, self.transport.close)
            self.transport.write_eof()
        else:
            self.transport.close()

    # -- request head deadline ------------------------------------------------------------

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
        if self.cycle is not self._armed_for or not self._between_requests() or self.transport.is_closing():
            return
        # Idle after a response: uvicorn's keep-alive timeout closes it, if nothing comes.
        if self.cycle is None or self._head_started:
            self.transport.close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    # -- body pace ------------------------------------------------------------------------

    def _follow_body(self) -> None:
        """Starts watching a new request's body; stops once the body is complete."""
        if self.cycle is None or self.transport.is_closing():
            return
        if self.cycle is not self._body_cycle:
            self._stop_body_watch()
            self._body_cycle = self.cycle
            if self._body_pending():
                now = self.loop.time()
                self._body = _BodyWatch(received=len(self.cycle.body), checked_at=now)
                self._body.timer = self.loop.call_later(self.body_pace.next_check(0.0), self._check_body)
        elif self._body is not None and not self._body_pending():
            self._stop_body_watch()

    def _body_pending(self) -> bool:
        """Whether the current request's body is still coming."""
        return self.cycle is not None and self.cycle.more_body and not self.cycle.response_complete

    def _stop_body_watch(self) -> None:
        if self._body is not None and self._body.timer is not None:
            self._body.timer.cancel()
        self._body = None

    def _check_body(self) -> None:
        watch = self._body
        if watch is None or self.cycle is not self._body_cycle or not self._body_pending():
            self._stop_body_watch()
            return
        now = self.loop.time()
        if not self._reading_held():
            watch.elapsed += now - watch.checked_at
        watch.checked_at = now
        if self.body_pace.broken(watch.elapsed, watch.received):
            self._body_too_slow()
            return
        watch.timer = self.loop.call_later(self.body_pace.next_check(watch.elapsed), self._check_body)

    def _reading_held(self) -> bool:
        """Whether the server, not the client, is why no body bytes come: reading paused until
        the application takes what arrived, or a 100 Continue the application has not asked for."""
        return bool(self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue))

    def _body_too_slow(self) -> None:
        self._stop_body_watch()
        cycle = self.cycle
        pace = self.body_pace
        rate = f", and after the first {pace.grace:g} s at {pace.min_rate:g} bytes/s or more" if pace.min_rate else ""
        error = RequestTimeoutError(
            f"The request body came too slowly: it must be complete within {pace.timeout:g} s{rate}."
        )
        if not cycle.response_started:
            self.transport.write(raw_response(error))
        cast(dict[str, Any], cycle.scope)[BODY_TIMED_OUT] = True
        # The application sees the client gone (its answer, if any, is dropped).
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()


class TurnAwayLog:
    """One warning per interval about connections turned away at the caps."""

    def __init__(self, caps: ConnectionCaps) -> None:
        self.caps = caps
        self._count = 0
        self._last: float | None = None

    def __call__(self) -> None:
        self._count += 1
        now = time.monotonic()
        if self._last is None or now - self._last >= TURNED_AWAY_LOG_INTERVAL:
            log.warning(
                "turned away %d connections at the connection caps (%d in all, %d per address)",
                self._count,
                self.caps.total,
                self.caps.per_address,
            )
            self._count, self._last = 0, now


class UnsupportedUvicornError(ValueError):
    """The installed uvicorn is not the one the connection limits were written for."""


def check_uvicorn(installed: str | None = None) -> None:
    """Refuses, with what to do, a uvicorn whose protocol internals may differ from the ones
    ``EdgeHttp`` relies on: silently broken connection limits would be worse than no start."""
    installed = installed or uvicorn.__version__
    if installed != UVICORN_WRITTEN_FOR:
        raise UnsupportedUvicornError(
            f"uvicorn {installed} is installed, but kimi-server's connection limits "
            f"(http/connections.py) build on the HTTP protocol of uvicorn {UVICORN_WRITTEN_FOR}, whose "
            f"internals change between releases. Install uvicorn=={UVICORN_WRITTEN_FOR} (as pinned in "
            "requirements.lock), e.g. pip install -r requirements.lock."
        )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` that bound idle and slow connections and their
    number. Raises the descriptor limit as far as allowed (once per start)."""
    check_uvicorn()
    install_accept_error_digest()
    caps = ConnectionCaps.from_settings(settings, raise_descriptor_limit())
    gate = ConnectionGate(caps, on_turn_away=TurnAwayLog(caps))
    pace = BodyPace(
        timeout=settings.http_body_timeout, min_rate=settings.http_body_min_rate, grace=settings.http_body_rate_grace
    )
    attributes = {"header_timeout": settings.http_header_timeout, "body_pace": pace, "gate": gate}
    protocol = type("KimiHttp", (EdgeHttp,), attributes)
    return {
        "http": protocol,
        # asyncio's own loop even where uvloop is installed: its accept() failures go through the
        # logging digest above (uvloop reports them its own way).
        "loop": "asyncio",
        "timeout_keep_alive": settings.http_keep_alive_timeout,
        "backlog": caps.backlog,
    }
