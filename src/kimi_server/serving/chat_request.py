"""Turns a Chat Completions request into the internal GenerationRequest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kimi_server.engines.types import (
    ContentPart,
    GenerationRequest,
    Message,
    OutputFormat,
    ToolCallRecord,
    ToolChoice,
    ToolSpec,
)
from kimi_server.errors import InvalidRequestError
from kimi_server.policy import rules
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile
from kimi_server.protocol.chat import (
    BuiltinFunctionTool,
    ChatCompletionRequest,
    ChatMessage,
    FunctionTool,
    ImagePart,
    NamedToolChoice,
    ResponseFormatJSONSchema,
    TextPart,
    VideoPart,
)
from kimi_server.serving.common import (
    budget_for,
    cache_policy,
    check_output_format,
    check_tool_choice,
    check_tools,
)
from kimi_server.serving.partial import chat_answer_prefix, check_answer_prefix
from kimi_server.serving.system_tools import declarations, declared_tools, in_force


def _url(value: Any) -> str:
    return value if isinstance(value, str) else str(value.url)


def convert_message(index: int, msg: ChatMessage, accepts_images: bool) -> Message:
    parts: list[ContentPart] = []
    if isinstance(msg.content, str):
        parts.append(ContentPart("text", msg.content))
    elif msg.content is not None:
        for j, part in enumerate(msg.content):
            if isinstance(part, TextPart):
                parts.append(ContentPart("text", part.text))
                continue
            if not accepts_images:
                kind, article = ("image", "an") if isinstance(part, ImagePart) else ("video", "a")
                raise InvalidRequestError(
                    f"This model cannot see {kind}s: 'messages[{index}].content[{j}]' is {article} "
                    f"{part.type} part. Send text only: the models this server runs read text.",
                    param=f"messages[{index}].content[{j}]",
                    code="unsupported_content",
                )
            if isinstance(part, ImagePart):
                parts.append(ContentPart("image", _url(part.image_url)))
            elif isinstance(part, VideoPart):
                parts.append(ContentPart("video", _url(part.video_url)))
    role = "system" if msg.role == "developer" else msg.role
    calls = tuple(
        ToolCallRecord(id=c.id, name=c.function.name, arguments=c.function.arguments, kind=c.type)
        for c in msg.tool_calls or ()
    )
    return Message.of_parts(
        role,
        parts,
        reasoning=msg.reasoning_content,
        tool_calls=calls,
        tool_call_id=msg.tool_call_id,
        name=msg.name,
    )


def _content_empty(content: str | list[Any] | None) -> bool:
    if isinstance(content, str):
        return not content
    return all(isinstance(part, TextPart) and not part.text for part in content or ())


def _with_declarations(index: int, msg: ChatMessage, converted: Message, profile: ContractProfile) -> Message:
    if msg.tools is None:
        return converted
    declared = declared_tools(
        msg.tools,
        role=msg.role,
        content_empty=_content_empty(msg.content),
        at=f"messages[{index}]",
        profile=profile,
        nested=True,
        strict_default=False,
    )
    return replace(converted, tools=declared)


def _tools(body: ChatCompletionRequest) -> list[ToolSpec]:
    out: list[ToolSpec] = []
    for i, tool in enumerate(body.tools or ()):
        if isinstance(tool, FunctionTool):
            fn = tool.function
            # Errors name the field where chat keeps it: tools[i].function.name (not Responses' flat tools[i].name).
            out.append(
                ToolSpec(fn.name, fn.description, fn.parameters, bool(fn.strict), "function", f"tools[{i}].function")
            )
        elif isinstance(tool, BuiltinFunctionTool):
            out.append(ToolSpec(tool.function.name, kind="web_search"))
        else:
            out.append(ToolSpec("$web_search", kind="web_search"))
    return out


def _tool_choice(body: ChatCompletionRequest) -> ToolChoice:
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        return ToolChoice("named", choice.function.name)
    if choice is None:
        return ToolChoice("auto")
    return ToolChoice(choice)


def _output_format(body: ChatCompletionRequest) -> OutputFormat:
    fmt = body.response_format
    if fmt is None:
        return OutputFormat()
    if isinstance(fmt, ResponseFormatJSONSchema):
        js = fmt.json_schema
        return OutputFormat("json_schema", js.schema_, js.name, js.strict is not False)
    return OutputFormat(fmt.type)


def build_chat_request(
    body: ChatCompletionRequest,
    *,
    served: frozenset[str],
    budgets: Mapping[str, Any],
    namespace: str,
    accepts_images: bool,
    output_defaults: Mapping[str, int] | None = None,
    contracts: Mapping[str, ContractProfile] | None = None,
) -> GenerationRequest:
    spec = rules.resolve_model(body.model, served)
    profile = (contracts or {}).get(spec.id, DEFAULT_PROFILE)
    effort = rules.resolve_effort(spec, body.reasoning_effort, param="reasoning_effort")
    reasoning = rules.resolve_thinking(profile, body.thinking)
    for name in rules.SAMPLING_FIELDS:
        rules.check_sampling(spec, name, getattr(body, name), profile=profile, reasoning=reasoning)
    max_out = rules.resolve_max_output(
        spec,
        primary=body.max_completion_tokens,
        primary_name="max_completion_tokens",
        legacy=body.max_tokens,
        legacy_name="max_tokens",
        default=(output_defaults or {}).get(spec.id),
    )
    options = body.prompt_cache_options
    cache = rules.resolve_cache_options(spec, options.model_dump() if options is not None else None)
    if body.logprobs:
        raise InvalidRequestError("'logprobs' is not supported.", param="logprobs")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4:
        raise InvalidRequestError("'stop' takes at most 4 sequences.", param="stop")
    # Partial Mode: a partial last message is the answer's start, not a turn of the conversation.
    prefix = chat_answer_prefix(body.messages)
    turns = body.messages[:-1] if prefix is not None else body.messages
    messages = tuple(
        _with_declarations(i, m, convert_message(i, m, accepts_images), profile) for i, m in enumerate(turns)
    )
    tools = [*_tools(body), *declarations(messages)]
    check_tools(tools, "tools", profile=profile)
    choice = _tool_choice(body)
    check_tool_choice(choice, tools, "tool_choice")
    fmt = _output_format(body)
    check_output_format(fmt, "response_format.json_schema")
    check_answer_prefix(prefix, fmt, choice, tools)
    if choice.mode == "none":
        tools = []
    messages = in_force(messages, tools)
    return GenerationRequest(
        model=spec.id,
        messages=messages,
        effort=effort,
        budget=budget_for(budgets, effort),
        max_output_tokens=max_out,
        tools=tuple(tools),
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        output_format=fmt,
        cache=cache_policy(spec, cache, namespace),
        stop=stop,
        seed=body.seed,
        reasoning=reasoning,
        end_user=body.user,
        answer_prefix=prefix,
    )
