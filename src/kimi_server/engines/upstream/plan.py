"""What one request sends to one upstream, and the events of one attempt.

The body is built once per upstream; how a forced call is kept decides what reads the answer:
the stream as it is (nothing forced, or an upstream that constrains calls itself and is then
checked), or the JSON answer read back as the call (``forced_calls``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from kimi_server.engines.cut_closing import UpstreamCloser, closed_when_cut
from kimi_server.engines.types import EngineEvent, GenerationRequest
from kimi_server.engines.upstream.forced_calls import CallReader, ForcedMode, as_calls, forced_mode
from kimi_server.engines.upstream.normalise import Normaliser
from kimi_server.engines.upstream.partial import without_echo
from kimi_server.engines.upstream.payload import build_body
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.engines.upstream.required_calls import Fallback, checked_call

# Slack over the output cap before an upstream's stream counts as endless.
PIECE_SLACK = 64


@dataclass(frozen=True, slots=True)
class Plan:
    req: GenerationRequest
    body: dict[str, Any]
    limit: int  # pieces past which the stream counts as endless
    forced: ForcedMode | None  # how a forced call is kept; None: no call is forced

    def normaliser(self, up: Upstream) -> Normaliser:
        return Normaliser(report_cache=up.cfg.capabilities.prompt_cache, separate_writes=self.req.cache.separate_writes)


def plan_for(req: GenerationRequest, up: Upstream, forced: ForcedMode | None = None) -> Plan:
    """The body for this upstream; ``forced`` overrides how the upstream keeps a forced call."""
    cfg = up.cfg
    caps = cfg.capabilities
    mode = forced or forced_mode(req, up.dialect, caps)
    if forced is not None:
        caps = caps.model_copy(update={"forced_tool_calls": forced})
    body = build_body(
        req, model=cfg.model or req.model, dialect=up.dialect, caps=caps, max_output_tokens=cfg.max_output_tokens
    )
    return Plan(req, body, body[up.dialect.max_tokens_field] + PIECE_SLACK, mode)


def attempt_events(up: Upstream, plan: Plan, normaliser: Normaliser) -> AsyncGenerator[EngineEvent, None]:
    events = _answer_events(up, plan, normaliser)
    # A structured answer or a call the cap cut is closed, as the embedded engine closes its own.
    closer = UpstreamCloser.for_request(plan.req)
    return events if closer is None else closed_when_cut(events, closer)


def _answer_events(up: Upstream, plan: Plan, normaliser: Normaliser) -> AsyncGenerator[EngineEvent, None]:
    deadline = time.monotonic() + up.cfg.total_timeout
    events = up.attempt(plan.body, normaliser, piece_limit=plan.limit, deadline=deadline)
    if plan.req.answer_prefix is not None:
        # The client has the prefix: an upstream that repeats it is not heard twice.
        return without_echo(events, plan.req.answer_prefix.text)
    if plan.forced == "json_schema":
        return as_calls(events, CallReader())
    if plan.forced == "native":
        # Checked, not trusted: an answer without the call is asked for again as a JSON answer.
        fallback = _json_fallback(up, plan, deadline) if up.cfg.capabilities.json_schema else None
        return checked_call(events, plan.req, up.name, fallback)
    return events


def _json_fallback(up: Upstream, plan: Plan, deadline: float) -> Fallback:
    def again(reasoned: bool) -> AsyncGenerator[EngineEvent, None]:
        # Reasoning the client has seen is not repeated: the second answer only has to be the call.
        req = replace(plan.req, reasoning=False) if reasoned else plan.req
        second = plan_for(req, up, forced="json_schema")
        events = up.attempt(second.body, second.normaliser(up), piece_limit=second.limit, deadline=deadline)
        return as_calls(events, CallReader())

    return again
