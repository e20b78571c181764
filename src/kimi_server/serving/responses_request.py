"""Turns a Responses request into the internal GenerationRequest.

The contract rules (model, effort, sampling, output cap, cache options, structured output) go
through ``policy.rules``, the same code the Chat Completions endpoint uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.types import (
    GenerationRequest,
    Message,
    OutputFormat,
    ToolChoice,
    ToolSpec,
)
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.policy import rules
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile
from kimi_server.protocol.responses import (
    AllowedTools,
    CustomTool,
    FormatJSONSchema,
    FunctionTool,
    NamedTool,
    NamespaceTool,
    ResponsesRequest,
    WebSearchTool,
    parse_items,
)
from kimi_server.serving.common import (
    CUSTOM_TOOLS,
    budget_for,
    cache_policy,
    check_output_format,
    check_tool_choice,
    check_tools,
)
from kimi_server.serving.responses_input import convert_items
from kimi_server.serving.sealing import Sealer
from kimi_server.serving.system_tools import declarations, in_force

# A namespaced function reaches the model as "<namespace>__<name>" and returns to the client as
# a function_call with "namespace" and "name" set apart again.
NAMESPACE_SEPARATOR = "__"
SUMMARY_CHARS = {"auto": 280, "concise": 280, "detailed": 1200}
INCLUDABLE = (
    "reasoning.encrypted_content",
    "web_search_call.results",
    "web_search_call.action.sources",
)


@dataclass(frozen=True)
class WireName:
    """How a tool name the model saw is written back on the wire."""

    name: str
    namespace: str | None = None


@dataclass(frozen=True)
class ResponsesPlan:
    gen: GenerationRequest
    echo: dict[str, Any]  # request settings, as the response object repeats them
    names: Mapping[str, WireName]
    summary_chars: int
    key_id: str
    include: tuple[str, ...] = ()  # what the client asked to see of the web-search items


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def _refuse_stateful(body: ResponsesRequest) -> None:
    resend = (
        "This server is stateless and stores nothing: send the earlier turns (the previous "
        "response's output items, reasoning items included) in 'input' instead."
    )
    for field, asked in (
        ("previous_response_id", body.previous_response_id is not None),
        ("conversation", body.conversation is not None),
        ("background", body.background is True),
        ("prompt", body.prompt is not None),
    ):
        if asked:
            raise InvalidRequestError(
                f"'{field}' is not supported. {resend}", param=field, code="unsupported_parameter"
            )


def _function(tool: FunctionTool, namespace: str | None) -> tuple[ToolSpec, dict[str, Any]]:
    strict = tool.strict is not False
    spec = ToolSpec(flat_name(tool.name, namespace), tool.description, tool.parameters, strict)
    echo = {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": strict,
    }
    return spec, echo


def _custom(tool: CustomTool, where: str) -> tuple[ToolSpec, dict[str, Any]]:
    # Checked here too (check_tools repeats it) so the message can say what to use instead.
    if tool.name not in CUSTOM_TOOLS:
        raise InvalidRequestError(
            f"Custom tools are supported only under the name 'apply_patch'; '{where}.name' is "
            f"{tool.name!r}. Declare other tools as function tools.",
            param=f"{where}.name",
            code="unsupported_tool",
        )
    return ToolSpec(tool.name, tool.description, kind="custom"), tool.model_dump(exclude_none=True)


@dataclass
class _Tools:
    specs: list[ToolSpec]
    where: list[str]
    echo: list[dict[str, Any]]
    names: dict[str, WireName]


def _tools(body: ResponsesRequest, profile: ContractProfile) -> _Tools:
    out = _Tools([], [], [], {})
    for i, tool in enumerate(body.tools or ()):
        where = f"tools[{i}]"
        if isinstance(tool, FunctionTool):
            spec, echo = _function(tool, None)
            out.names[spec.name] = WireName(tool.name)
        elif isinstance(tool, CustomTool):
            spec, echo = _custom(tool, where)
            out.names[spec.name] = WireName(tool.name)
        elif isinstance(tool, NamespaceTool):
            inner_echo: list[dict[str, Any]] = []
            for j, inner in enumerate(tool.tools):
                if not isinstance(inner, FunctionTool):
                    raise InvalidRequestError(
                        f"'{where}.tools[{j}]': a namespace may hold only function tools.",
                        param=f"{where}.tools[{j}].type",
                        code="unsupported_tool",
                    )
                spec, one = _function(inner, tool.name)
                if len(spec.name) > profile.tool_name_max:
                    raise InvalidRequestError(
                        f"'{where}.tools[{j}]' reaches the model as {spec.name!r} (namespace and "
                        f"name joined by '__'), which is longer than {profile.tool_name_max} "
                        "characters.",
                        param=f"{where}.tools[{j}].name",
                    )
                out.specs.append(spec)
                out.where.append(f"{where}.tools[{j}]")
                out.names[spec.name] = WireName(inner.name, tool.name)
                inner_echo.append(one)
            out.echo.append(
                {
                    "type": "namespace",
                    "name": tool.name,
                    "description": tool.description,
                    "tools": inner_echo,
                }
            )
            continue
        else:  # web search: run by the server, see serving/responses_search.py
            assert isinstance(tool, WebSearchTool)
            spec, echo = ToolSpec(WEB_SEARCH_NAME, kind="web_search"), {"type": "web_search"}
        out.specs.append(spec)
        out.where.append(where)
        out.echo.append(echo)
    return out


def _tool_choice(body: ResponsesRequest, tools: list[ToolSpec]) -> tuple[ToolChoice, list[ToolSpec], Any]:
    """The choice, the tools the model may see under it, and its echo."""
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        mode = choice or "auto"
        return ToolChoice(mode), tools, mode
    if isinstance(choice, NamedTool):
        return ToolChoice("named", choice.name), tools, choice.model_dump()
    assert isinstance(choice, AllowedTools)
    allowed = {t.name for t in choice.tools}
    unknown = allowed - {t.name for t in tools}
    if unknown:
        raise InvalidRequestError(
            f"'tool_choice.tools' names {sorted(unknown)!r}, which are not among the tools.",
            param="tool_choice.tools",
        )
    return ToolChoice(choice.mode), [t for t in tools if t.name in allowed], choice.model_dump()


def _output_format(body: ResponsesRequest) -> tuple[OutputFormat, dict[str, Any]]:
    fmt = body.text.format if body.text else None
    if fmt is None:
        return OutputFormat(), {"type": "text"}
    if isinstance(fmt, FormatJSONSchema):
        strict = fmt.strict is not False
        echo = {
            "type": "json_schema",
            "name": fmt.name,
            "description": fmt.description,
            "schema": fmt.schema_,
            "strict": strict,
        }
        return OutputFormat("json_schema", fmt.schema_, fmt.name, strict), echo
    return OutputFormat(fmt.type), {"type": fmt.type}


def _check_include(body: ResponsesRequest) -> None:
    for i, value in enumerate(body.include or ()):
        if value not in INCLUDABLE:
            raise InvalidRequestError(
                f"Invalid value for 'include[{i}]': {value!r}. Supported values: {', '.join(INCLUDABLE)}.",
                param=f"include[{i}]",
                code="unsupported_value",
            )
    if body.top_logprobs:
        raise InvalidRequestError("'top_logprobs' is not supported.", param="top_logprobs")


def build_responses_request(
    body: ResponsesRequest,
    *,
    served: frozenset[str],
    budgets: Mapping[str, Any],
    key_id: str,
    accepts_images: bool,
    sealer: Sealer,
    output_defaults: Mapping[str, int] | None = None,
    contracts: Mapping[str, ContractProfile] | None = None,
) -> ResponsesPlan:
    _refuse_stateful(body)
    spec = rules.resolve_model(body.model, served)
    profile = (contracts or {}).get(spec.id, DEFAULT_PROFILE)
    requested_effort = body.reasoning.effort if body.reasoning else None
    effort = rules.resolve_effort(spec, requested_effort, param="reasoning.effort")
    reasoning = rules.resolve_thinking(profile, body.thinking)
    for name in rules.SAMPLING_FIELDS:
        rules.check_sampling(spec, name, getattr(body, name), profile=profile, reasoning=reasoning)
    max_out = rules.resolve_max_output(
        spec,
        primary=body.max_output_tokens,
        primary_name="max_output_tokens",
        default=(output_defaults or {}).get(spec.id),
    )
    options = body.prompt_cache_options
    cache = rules.resolve_cache_options(spec, options.model_dump() if options else None)
    _check_include(body)
    fmt, fmt_echo = _output_format(body)
    rules.check_structured_output(spec, fmt.kind, param="text.format")
    check_output_format(fmt, "text.format")
    tools = _tools(body, profile)

    raw = body.input
    items = parse_items(raw) if isinstance(raw, list) else []
    messages: list[Message] = [Message("system", body.instructions)] if body.instructions else []
    if isinstance(raw, str):
        messages.append(Message("user", raw))
    messages += convert_items(
        items,
        accepts_images=accepts_images,
        open_reasoning=lambda blob, param: sealer.open(blob, key_id=key_id, param=param),
        flat_name=flat_name,
        profile=profile,
    )
    if not messages or all(m.role == "system" for m in messages):
        raise InvalidRequestError("'input' holds no conversation turn.", param="input")
    # The request's tools and those system items declare: one set, one set of rules.
    all_tools = [*tools.specs, *declarations(messages)]
    check_tools(all_tools, "tools", tools.where, profile=profile)
    choice, visible, choice_echo = _tool_choice(body, all_tools)
    check_tool_choice(choice, visible, "tool_choice")
    if choice.mode == "none":
        visible = []
    conversation = in_force(messages, visible)

    summary = (body.reasoning.summary if body.reasoning else None) or "auto"
    parallel = body.parallel_tool_calls is not False
    gen = GenerationRequest(
        model=spec.id,
        messages=conversation,
        effort=effort,
        budget=budget_for(budgets, effort),
        max_output_tokens=max_out,
        tools=tuple(visible),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        output_format=fmt,
        cache=cache_policy(spec, cache, key_id),
        prompt_param="input",
        reasoning=reasoning,
        end_user=body.safety_identifier or body.user,
    )
    text_echo: dict[str, Any] = {"format": fmt_echo}
    if body.text and body.text.verbosity:
        text_echo["verbosity"] = body.text.verbosity
    echo = {
        "instructions": body.instructions,
        "reasoning": {"effort": requested_effort, "summary": summary},
        "text": text_echo,
        "tools": tools.echo,
        "tool_choice": choice_echo,
        "max_output_tokens": max_out,
        "temperature": rules.fixed_temperature(spec, profile, reasoning=reasoning),
        "top_p": spec.fixed_top_p,
        "parallel_tool_calls": parallel,
        "prompt_cache_options": cache.as_dict(),
        "metadata": body.metadata or {},
        "safety_identifier": body.safety_identifier,
        "prompt_cache_key": body.prompt_cache_key,
    }
    return ResponsesPlan(gen, echo, tools.names, SUMMARY_CHARS[summary], key_id, tuple(body.include or ()))
