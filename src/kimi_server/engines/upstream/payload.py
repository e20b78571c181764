"""GenerationRequest -> the Chat Completions body an upstream receives.

The catalogue's rules were applied when the request was built; here they become fields: the
effort through the dialect's reasoning controls, the model's fixed sampling, the output cap.
A request that needs something the upstream lacks is refused first, with a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from kimi_server.engines.types import ContentPart, GenerationRequest, Message, ToolSpec
from kimi_server.engines.upstream.dialects import Dialect
from kimi_server.engines.upstream.forced_calls import check_forced, forced_mode, json_answer_fields
from kimi_server.engines.upstream.partial import check_partial, prefix_fields, prefix_message
from kimi_server.engines.upstream.system_tools import message_fields, request_tools
from kimi_server.engines.web_search_tool import expose_web_search
from kimi_server.errors import InvalidRequestError
from kimi_server.policy.catalogue import find_model
from kimi_server.settings import UpstreamCapabilities


def check_capabilities(req: GenerationRequest, caps: UpstreamCapabilities, dialect: Dialect) -> None:
    if req.tools and not caps.tools:
        raise InvalidRequestError(
            f"{req.model} is served by an upstream engine without tool support; send the request without 'tools'.",
            param="tools",
            code="unsupported_parameter",
        )
    if any(t.kind == "custom" for t in req.tools):
        raise InvalidRequestError(
            f"Custom (freeform) tools are not available on {req.model}: its upstream engine takes function tools only.",
            param="tools",
            code="unsupported_tool",
        )
    check_forced(req, dialect, caps)
    check_partial(req, dialect)
    if req.output_format.kind == "json_schema" and not caps.json_schema:
        raise InvalidRequestError(
            f"{req.model} is served by an upstream engine without JSON Schema output; send the "
            "request without a json_schema format.",
            param="response_format",
            code="unsupported_parameter",
        )
    if not caps.vision and any(m.images or m.videos for m in req.messages):
        raise InvalidRequestError(
            f"{req.model} is served by an upstream engine without vision; send text only.",
            param="messages",
            code="unsupported_content",
        )


def _content(msg: Message, vision: bool) -> str | list[dict[str, Any]]:
    if not (vision and (msg.images or msg.videos)):
        return msg.text
    if msg.parts:  # the client's order: an image may belong to the text around it
        return [_part(p) for p in msg.parts]
    parts: list[dict[str, Any]] = []
    if msg.text:
        parts.append({"type": "text", "text": msg.text})
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in msg.images]
    parts += [{"type": "video_url", "video_url": {"url": u}} for u in msg.videos]
    return parts


def _part(part: ContentPart) -> dict[str, Any]:
    if part.kind == "text":
        return {"type": "text", "text": part.value}
    field = f"{part.kind}_url"
    return {"type": field, field: {"url": part.value}}


def _message(msg: Message, dialect: Dialect, vision: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role, "content": _content(msg, vision)}
    if msg.role == "assistant":
        if msg.reasoning and dialect.reasoning_history:
            out["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in msg.tool_calls
            ]
            if not msg.text:
                out["content"] = None
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None and msg.role != "tool":
        out["name"] = msg.name
    out.update(message_fields(msg, dialect.system_tools, _tool))
    return out


def build_body(
    req: GenerationRequest,
    *,
    model: str,
    dialect: Dialect,
    caps: UpstreamCapabilities,
    max_output_tokens: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [_message(m, dialect, caps.vision) for m in req.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.answer_prefix is not None:  # Partial Mode, as the dialect carries it
        body["messages"].append(prefix_message(req.answer_prefix, dialect))
        body.update(prefix_fields(dialect))
    cap = req.max_output_tokens
    body[dialect.max_tokens_field] = min(cap, max_output_tokens) if max_output_tokens else cap
    spec = find_model(req.model)
    # With reasoning off the upstream's own non-thinking sampling applies (Moonshot refuses
    # kimi-k3's thinking temperature there).
    if spec is not None and req.reasoning:
        body["temperature"] = spec.fixed_temperature
        body["top_p"] = spec.fixed_top_p
    if req.tools:
        body.update(_tool_fields(req, dialect))
    _output_format(body, req, dialect, caps)
    if req.stop:
        body["stop"] = list(req.stop)
    if req.seed is not None:
        body["seed"] = req.seed
    if req.reasoning:
        body.update(dialect.reasoning_controls(req.effort, caps.reasoning))
    else:
        body.update(dialect.thinking_off())
    cacheable = caps.prompt_cache and spec is not None and spec.accepts_cache_options
    body.update(dialect.extra(req.cache.ttl_label if cacheable else None))
    return body


def _tool_fields(req: GenerationRequest, dialect: Dialect) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    listed = request_tools(expose_web_search(req), dialect.system_tools)
    if listed:  # empty: every tool is declared in a system message the upstream reads
        fields["tools"] = [_tool(t) for t in listed]
    choice = req.tool_choice
    fields["tool_choice"] = (
        {"type": "function", "function": {"name": choice.name}} if choice.mode == "named" else choice.mode
    )
    if not req.parallel_tool_calls:
        fields["parallel_tool_calls"] = False
    return fields


def _output_format(body: dict[str, Any], req: GenerationRequest, dialect: Dialect, caps: UpstreamCapabilities) -> None:
    fmt = req.output_format
    if forced_mode(req, dialect, caps) == "json_schema":
        # One call as a JSON answer (forced_calls.py); it replaces any output format.
        body.pop("parallel_tool_calls", None)
        body.update(json_answer_fields(expose_web_search(req)))
    elif fmt.kind == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt.kind == "json_schema":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "schema": fmt.schema, "strict": fmt.strict},
        }


def _tool(t: ToolSpec) -> dict[str, Any]:
    # $web_search reaches every engine as a function with a query (engines/web_search_tool.py);
    # kimi-server runs the search when the client echoes the call, as on the embedded engine.
    return {
        "type": "function",
        "function": {
            "name": t.name,
            **({"description": t.description} if t.description else {}),
            "parameters": t.parameters or {"type": "object", "properties": {}},
            **({"strict": True} if t.strict else {}),
        },
    }
