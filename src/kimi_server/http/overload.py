"""Overload and abuse at the HTTP edge.

- ``measure_prompt``: the prompt's size, before anything is reserved: characters first, then
  the engine's own token count where it can tell (a 400 at once for what cannot fit).
- ``admit``: the one step a generating route takes before the engine: the request waits its
  turn in the engine's fair queue (``gate/admission.py``). The ticket is released when the request's response is
  done or abandoned, streaming included.
- ``until_disconnected``: runs a non-streaming generation, and stops it when the client leaves.
- ``OverloadGuard``: pure ASGI, before any route: the key is checked before the body is read,
  the JSON body is checked for depth and lone surrogates, and tickets are always released.
- ``tenant_engine_stats`` / ``server_totals``: what a key may see, and what only operators may.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.engines.base import Engine, PromptCounter
from kimi_server.engines.owner import current_owner
from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import APIError, AuthenticationError, InvalidRequestError, RequestTimeoutError
from kimi_server.gate.admission import Admission, AdmissionLimits, Ticket
from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.http.admin_key import admin_key_refusal
from kimi_server.http.connections import BODY_TIMED_OUT
from kimi_server.http.errors import error_headers
from kimi_server.settings import Settings

T = TypeVar("T")
TICKETS = "kimi.tickets"  # scope key: the tickets a request holds, released by the guard
PUBLIC_PATHS = frozenset({"/health"})
DOCS_PATHS = frozenset({"/docs", "/openapi.json"})
ADMIN_PREFIX = "/admin/"
METRICS_PATH = "/metrics"
KeyCheck = Callable[[str | None], Awaitable[object]]


@dataclass(frozen=True)
class PromptLimits:
    max_messages: int
    max_parts: int
    max_chars: int
    window: int  # the engine's context window, in tokens

    @classmethod
    def from_settings(cls, s: Settings, window: int | None = None) -> PromptLimits:
        """``window``: the engine's own (an upstream's may be far larger than ``ctx_size``;
        one that is not configured gets the hosted API's)."""
        w = window or s.ctx_size
        return cls(
            max_messages=s.max_messages or max(1, w // 4),
            max_parts=s.max_content_parts or w,
            max_chars=s.max_prompt_chars or 8 * w,
            window=w,
        )


HOSTED_WINDOW = 1_048_576  # the Kimi API's context window, for upstreams that declare none


class AdmissionSet:
    """One admission queue per engine (engines shared by several model ids share one)."""

    def __init__(self, engines: Iterable[Engine], settings: Settings) -> None:
        def limits(engine: Engine) -> AdmissionLimits:
            return AdmissionLimits(
                slots=engine.concurrency() or settings.parallel,
                max_queue=settings.queue_max,
                max_queue_per_key=settings.queue_max_per_key,
                max_wait=settings.queue_max_wait,
            )

        engines = list(engines)
        self._by_engine = {id(e): (e, Admission(limits(e))) for e in engines}
        self._prompt_limits = {
            id(e): PromptLimits.from_settings(settings, e.context_length() or HOSTED_WINDOW) for e in engines
        }

    def for_engine(self, engine: Engine) -> Admission:
        return self._by_engine[id(engine)][1]

    def prompt_limits(self, engine: Engine) -> PromptLimits:
        return self._prompt_limits[id(engine)]

    def items(self) -> list[tuple[Engine, Admission]]:
        return list(self._by_engine.values())


def admission_set(app: FastAPI) -> AdmissionSet:
    found: AdmissionSet = app.state.kimi_admission
    return found


# -- before the engine ------------------------------------------------------------------------


def prompt_size(gen: GenerationRequest) -> tuple[int, int, int]:
    """(messages, parts, characters) of a request, counted without tokenizing anything."""
    parts = chars = 0
    for m in gen.messages:
        parts += 1 + len(m.images) + len(m.videos) + len(m.tool_calls)
        chars += len(m.text) + len(m.reasoning or "")
        chars += sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
    for tool in gen.tools:
        chars += len(tool.name) + len(tool.description or "")
        if tool.parameters is not None:
            chars += len(json.dumps(tool.parameters, ensure_ascii=False))
    return len(gen.messages), parts, chars


def check_prompt_size(gen: GenerationRequest, limits: PromptLimits, *, param: str) -> None:
    """A 400 at once for a prompt that cannot fit the context window, whatever its tokens."""
    messages, parts, chars = prompt_size(gen)
    if messages > limits.max_messages:
        raise too_many_messages(messages, limits.max_messages, param)
    if parts > limits.max_parts:
        raise InvalidRequestError(
            f"'{param}' has {parts} parts (messages, content parts and tool calls); this server "
            f"accepts at most {limits.max_parts} in one request.",
            param=param,
            code="too_many_parts",
        )
    if chars > limits.max_chars:
        raise InvalidRequestError(
            f"'{param}' holds {chars} characters, more than this model's context window of "
            f"{limits.window} tokens can take ({limits.max_chars} characters at most). Shorten "
            "the conversation.",
            param=param,
            code="context_length_exceeded",
        )


def too_many_messages(count: int, limit: int, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"'{param}' has {count} messages; this server accepts at most {limit} in one request.",
        param=param,
        code="too_many_messages",
    )


def check_prompt_tokens(
    tokens: int, gen: GenerationRequest, limits: PromptLimits, *, bound: int | None, param: str
) -> None:
    """The prompt's real token count against the window, with room for the least output the
    request must be able to give (its reasoning floor and one answer token, or its whole output
    cap where that is smaller), then against the operator's bound on one prompt."""
    room = min(gen.max_output_tokens, gen.budget.floor + 1)
    if tokens + room > limits.window:
        raise InvalidRequestError(
            f"'{param}' is {tokens} tokens long; with {room} tokens of output it needs "
            f"{tokens + room}, more than this model's context window of {limits.window} tokens. "
            "Shorten the conversation.",
            param=param,
            code="context_length_exceeded",
        )
    if bound is not None and tokens > bound:
        raise InvalidRequestError(
            f"'{param}' is {tokens} tokens long; this server takes prompts of at most {bound} "
            "tokens on this model (max_prompt_tokens). Shorten the conversation.",
            param=param,
            code="context_length_exceeded",
        )


async def measure_prompt(request: Request, engine: Engine, gen: GenerationRequest, *, param: str) -> int | None:
    """The prompt's size, checked before the request reserves or waits for anything: first the
    cheap bound on messages, parts and characters (nothing tokenized, so a huge body costs
    little), then the engine's own token count (400s naming the numbers). Returns that count;
    None for an engine that cannot count (sized by characters only)."""
    limits = admission_set(request.app).prompt_limits(engine)
    check_prompt_size(gen, limits, param=param)
    if not isinstance(engine, PromptCounter):
        return None
    tokens = await engine.count_prompt_tokens(gen)
    if tokens is not None:
        check_prompt_tokens(tokens, gen, limits, bound=engine.prompt_token_limit(), param=param)
    return tokens


async def admit(
    request: Request, principal: Principal, engine: Engine, gen: GenerationRequest, *, param: str
) -> Ticket:
    """A fair turn at the engine, for a request whose size ``measure_prompt`` checked. The guard
    releases the ticket at the end of the request (response sent, stream ended or client gone);
    ``ticket.release()`` may do it sooner."""
    tickets: list[Ticket] | None = request.scope.get(TICKETS)
    if tickets is None:
        raise RuntimeError("OverloadGuard is not installed")
    admissions = admission_set(request.app)
    current_owner.set(principal.key_id)  # per-tenant engine counters (engines/owner.py)
    # A client that leaves while waiting gives its place back (nothing else would notice).
    ticket = await until_disconnected(
        request, admissions.for_engine(engine).admit(principal.key_id), discard=Ticket.release
    )
    tickets.append(ticket)
    return ticket


async def until_disconnected(
    request: Request, work: Awaitable[T], discard: Callable[[T], object] | None = None
) -> T:
    """Awaits ``work``; if the client disconnects first, cancels it (which stops the engine's
    slot at its next token) and raises ``ClientGone``. ``discard`` gets a result that arrived
    anyway (a cancellation can lose the race with a result that was already set)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if discard is not None and not task.cancelled() and task.exception() is None:
            discard(task.result())
        raise ClientGone
    finally:
        watcher.cancel()
        task.cancel()


async def _disconnected(request: Request) -> None:
    # The body was read before the route ran, so the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(APIError):
    """The client left before the answer was ready; nobody reads this response."""

    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("The client closed the request.")


# -- the edge ---------------------------------------------------------------------------------


class OverloadGuard:
    def __init__(
        self, app: ASGIApp, *, keys: KeyRing, settings: Settings, check_key: KeyCheck | None = None
    ) -> None:
        self.app = app
        self.keys = keys
        # Stored keys (the gateway) need a lookup; without one the static key ring decides.
        self.check_key = check_key
        self.public_docs = settings.public_docs
        # None: the admin API is off (it lives in the gateway's store).
        self.admin_key = settings.admin_key if settings.gateway_enabled else None
        self.max_depth = settings.max_json_depth
        self.max_messages = PromptLimits.from_settings(settings).max_messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tickets: list[Ticket] = []
        scope[TICKETS] = tickets
        try:
            await self._handle(scope, receive, send)
        finally:
            for ticket in tickets:
                ticket.release()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or ())
        path = scope.get("path", "")
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        raw = headers.get(b"authorization")
        refusal = await self._refusal(path, raw.decode("latin-1") if raw is not None else None)
        if refusal is not None:
            # Checked before the body is read; an unread body ends the connection.
            await _send_error(send, refusal, close=has_body)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        if scope.get("method") != "POST" or self._key_for(path) is None:
            # A body this guard does not check (a keyless route's, say) is not read here:
            # if the route leaves it unread too, the answer ends the connection.
            closing_receive, closing_send = _closing_if_unread(receive, send)
            await self.app(scope, closing_receive, closing_send)
            return
        body = await _read_body(receive)
        if body is None:
            # The client left, or its body came too slowly and the connection already got its
            # 408 (http/connections.py). Nobody reads this answer: it is for the request log.
            ended: APIError = ClientGone()
            if scope.get(BODY_TIMED_OUT):
                ended = RequestTimeoutError("The request body came too slowly.")
            await _send_error(send, ended, close=True)
            return
        problem = self._check_json(body, path)
        if problem is not None:
            await _send_error(send, problem, close=False)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _refusal(self, path: str, authorization: str | None) -> APIError | None:
        """Why this request may not go on, decided on its head alone; None if it may."""
        needed = self._key_for(path)
        if needed == "admin":
            return admin_key_refusal(self.admin_key, authorization)
        if needed == "tenant":
            try:
                if self.check_key is not None:
                    await self.check_key(authorization)
                else:
                    self.keys.authenticate(authorization)
            except AuthenticationError as exc:
                return exc
        return None

    def _key_for(self, path: str) -> Literal["admin", "tenant"] | None:
        """The key a path needs: the admin key, an API key, or none."""
        if path.startswith(ADMIN_PREFIX):
            return "admin"
        if path in PUBLIC_PATHS or (self.public_docs and path in DOCS_PATHS):
            return None
        if path == METRICS_PATH:  # every key's traffic: the admin key, checked by the route itself
            return None
        return "tenant"

    def _check_json(self, body: bytes, path: str) -> InvalidRequestError | None:
        """Cheap checks first (C-speed scans of the bytes), so that a hostile body costs little:
        depth, then the length of the message list, then surrogates where there may be any."""
        if bracket_depth(body) > self.max_depth:
            return _too_deep(self.max_depth)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return None  # not JSON: the route's own parsing answers with its 400
        param = MESSAGE_LISTS.get(path)
        listed = data.get(param) if param and isinstance(data, dict) else None
        if param and isinstance(listed, list) and len(listed) > self.max_messages:
            return too_many_messages(len(listed), self.max_messages, param)
        if _MAYBE_SURROGATE.search(body):
            return json_problem(data, self.max_depth)
        return None


MESSAGE_LISTS = {"/v1/chat/completions": "messages", "/v1/responses": "input"}
# A lone surrogate reaches Python only as a \uD800-\uDFFF escape or as raw surrogate bytes
# (which json.loads lets through): without either, no string needs a look.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89abAB]|\\u[dD][c-fC-F]|\xed[\xa0-\xbf]")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def bracket_depth(body: bytes) -> int:
    """How deep a JSON text nests, counted on its bytes (strings removed) without parsing it."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def json_problem(data: Any, max_depth: int) -> InvalidRequestError | None:
    """The first lone surrogate or too-deep nesting in a parsed JSON value; iterative, so any
    depth is safe to inspect."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return _too_deep(max_depth)
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                return InvalidRequestError(
                    f"Invalid value for '{path or 'body'}': the string holds a lone UTF-16 "
                    "surrogate (such as \\ud800), which is not valid Unicode text.",
                    param=path or None,
                    code="invalid_unicode",
                )
        elif isinstance(node, dict):
            for key, value in node.items():
                where = f"{path}.{key}" if path else str(key)
                if _has_lone_surrogate(key):
                    return InvalidRequestError(
                        f"A field name in '{path or 'body'}' holds a lone UTF-16 surrogate.",
                        param=path or None,
                        code="invalid_unicode",
                    )
                stack.append((value, depth + 1, where))
        elif isinstance(node, list):
            stack.extend((value, depth + 1, f"{path}[{i}]") for i, value in enumerate(node))
    return None


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep(max_depth: int) -> InvalidRequestError:
    return InvalidRequestError(
        f"The request body nests JSON more than {max_depth} levels deep.", code="json_too_deep"
    )


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body; None if the connection ended first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _closing_if_unread(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """Adds ``Connection: close`` to an answer sent before the body was read to its end: the
    rest of it is never read, so the connection cannot serve another request."""
    finished = False

    async def tracking_receive() -> Message:
        nonlocal finished
        message = await receive()
        finished = finished or message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start" and not finished:
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return tracking_receive, closing_send


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(send: Send, error: APIError, *, close: bool) -> None:
    body = json.dumps(error.to_body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error).items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- figures ----------------------------------------------------------------------------------


def tenant_engine_stats(app: FastAPI, key_id: str) -> list[dict[str, Any]]:
    """Per engine, the caller's own figures only: its calls in flight and cancelled, its
    requests admitted, waiting and refused. Nothing here moves with another key's traffic."""
    rows = []
    for engine, admission in admission_set(app).items():
        rows.append({"engine": engine.name, **engine.tenant_stats(key_id), **admission.key_stats(key_id)})
    return rows


def server_totals(app: FastAPI) -> list[dict[str, Any]]:
    """Server-wide figures per engine, for operators (``/metrics``), never for tenants: the
    engine's own totals (calls in flight and cancelled, ``cache_*``) and the queue's
    (``queue_*``: slots, admitted, waiting, refusals)."""
    return [
        {
            "engine": engine.name,
            **engine.stats(),
            **{f"queue_{name}": value for name, value in admission.totals().items()},
        }
        for engine, admission in admission_set(app).items()
    ]
