"""Turns a Messages request (and a ``count_tokens`` one) into the internal GenerationRequest.

The contract rules (model, effort levels, sampling, output cap, cache TTLs, structured output,
the thinking switch per profile) go through ``policy.rules``, the code the other endpoints use;
docs/contract-messages.md says what each Anthropic field maps onto.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.types import AnswerPrefix, GenerationRequest, OutputFormat
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.policy import rules
from kimi_server.policy.catalogue import ModelSpec, SamplingRule
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile
from kimi_server.policy.rules import CacheOptions
from kimi_server.protocol.messages import (
    CacheControl,
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
)
from kimi_server.serving.common import budget_for, cache_policy, check_output_format, check_tool_choice, check_tools
from kimi_server.serving.messages_input import convert
from kimi_server.serving.messages_thinking import effort_level, keep_thinking_from, reasoning_and_display
from kimi_server.serving.messages_tools import WebSearchOptions, convert_tool_choice, convert_tools
from kimi_server.serving.partial import check_answer_prefix
from kimi_server.serving.sealing import Sealer

MAX_STOP_SEQUENCES = 16
OUTPUT_FORMAT_NAME = "output"  # output_config.format has no name; the grammar wants one


@dataclass(frozen=True)
class MessagesPlan:
    gen: GenerationRequest
    model: str  # the served model's id, reported as the answer's ``model``
    show_thinking: bool  # False: thinking blocks carry their signature only (display "omitted")
    web_search: WebSearchOptions | None  # the server web search tool, when the request has it
    user_id: str | None  # metadata.user_id, for the ledger
    key_id: str
    stream: bool


def _model(body: CountTokensRequest, served: frozenset[str], aliases: Mapping[str, str]) -> ModelSpec:
    try:
        return rules.resolve_model(aliases.get(body.model, body.model), served)
    except NotFoundError:
        # Named as the client wrote it, whatever it is an alias of.
        raise NotFoundError(
            f"The model '{body.model}' does not exist or you do not have access to it.", param="model"
        ) from None


def _refuse_unhonoured(body: CountTokensRequest) -> None:
    """Fields that would change the answer if ignored."""
    for name, asked, why in (
        ("mcp_servers", bool(body.mcp_servers), "this server connects to no MCP servers"),
        ("container", body.container is not None, "this server runs no code containers"),
    ):
        if asked:
            raise InvalidRequestError(f"'{name}' is not supported: {why}.", param=name, code="unsupported_parameter")


def _check_sampling(spec: ModelSpec, profile: ContractProfile, body: MessagesRequest, reasoning: bool) -> None:
    rules.check_sampling(spec, "temperature", body.temperature, profile=profile, reasoning=reasoning)
    rules.check_sampling(spec, "top_p", body.top_p, profile=profile, reasoning=reasoning)
    fixed = spec.sampling is SamplingRule.FIXED or profile.sampling_for(spec.id, reasoning=reasoning) is not None
    if body.top_k is not None and fixed:
        # A model whose sampling is fixed would not sample as asked; one that ignores
        # temperature and top_p ignores top_k alike.
        raise InvalidRequestError(
            f"'top_k' is not supported by {spec.id}: its sampling is fixed; omit this field.",
            param="top_k",
            code="unsupported_value",
        )


def _stop_sequences(body: MessagesRequest) -> tuple[str, ...]:
    stops = tuple(body.stop_sequences or ())
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequestError(
            f"'stop_sequences' takes at most {MAX_STOP_SEQUENCES} sequences; {len(stops)} were given.",
            param="stop_sequences",
        )
    for k, stop in enumerate(stops):
        if not stop:
            raise InvalidRequestError(f"'stop_sequences[{k}]' must not be empty.", param=f"stop_sequences[{k}]")
    return stops


def _cache_marks(body: CountTokensRequest) -> list[CacheControl]:
    """Every ``cache_control`` of the request: top level, system, message blocks (and the
    parts of tool results), tools."""
    marks: list[CacheControl | None] = [body.cache_control]
    if isinstance(body.system, list):
        marks += [b.cache_control for b in body.system]
    for message in body.messages:
        for block in message.content if isinstance(message.content, list) else ():
            marks.append(getattr(block, "cache_control", None))
            if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                marks += [getattr(part, "cache_control", None) for part in block.content]
    marks += [getattr(tool, "cache_control", None) for tool in body.tools or ()]
    return [m for m in marks if m is not None]


def _cache(spec: ModelSpec, body: CountTokensRequest) -> CacheOptions:
    """The longest TTL any ``cache_control`` asks for. The prompt cache is implicit (every
    prefix is cached), so a mark only chooses how long; a model without cache options runs its
    default and the marks are ignored (clients send them on every request)."""
    ttls = {mark.ttl or "5m" for mark in _cache_marks(body)}
    if not ttls or not spec.accepts_cache_options:
        return CacheOptions()
    return rules.resolve_cache_options(spec, {"ttl": "1h" if "1h" in ttls else "5m"}, param="cache_control")


def _output_format(spec: ModelSpec, body: CountTokensRequest) -> OutputFormat:
    fmt = body.output_config.format if body.output_config else None
    if fmt is None:
        return OutputFormat()
    rules.check_structured_output(spec, "json_schema", param="output_config.format")
    out = OutputFormat("json_schema", fmt.schema_, OUTPUT_FORMAT_NAME, strict=True)
    check_output_format(out, "output_config.format")
    return out


def _prefill(body: CountTokensRequest) -> AnswerPrefix | None:
    """Anthropic's prefill: a conversation that ends in an assistant message continues it, as
    Chat's Partial Mode does (serving/partial.py); the answer's content leaves it out."""
    if not body.messages:
        raise InvalidRequestError("'messages' must hold at least one message.", param="messages")
    last = len(body.messages) - 1
    message = body.messages[last]
    if message.role != "assistant":
        return None
    content = message.content
    if isinstance(content, str):
        return AnswerPrefix(content, param=f"messages[{last}].content")
    for j, block in enumerate(content):
        if not isinstance(block, TextBlock):
            raise InvalidRequestError(
                f"'messages[{last}].content[{j}]': a final assistant message is a prefill the answer "
                "continues; it may hold text blocks only.",
                param=f"messages[{last}].content[{j}]",
                code="unsupported_value",
            )
    text = "".join(block.text for block in content if isinstance(block, TextBlock))
    return AnswerPrefix(text, param=f"messages[{last}].content")


def _build(
    body: CountTokensRequest,
    create: MessagesRequest | None,
    *,
    served: frozenset[str],
    budgets: Mapping[str, Any],
    key_id: str,
    accepts_images: bool,
    sealer: Sealer,
    output_defaults: Mapping[str, int] | None,
    contracts: Mapping[str, ContractProfile] | None,
    aliases: Mapping[str, str] | None,
) -> MessagesPlan:
    _refuse_unhonoured(body)
    spec = _model(body, served, aliases or {})
    profile = (contracts or {}).get(spec.id, DEFAULT_PROFILE)
    reasoning, show_thinking = reasoning_and_display(profile, body)
    effort = effort_level(spec, body, budgets, create.max_tokens if create else None)
    if create is not None:
        _check_sampling(spec, profile, create, reasoning)
    max_out = rules.resolve_max_output(
        spec,
        primary=create.max_tokens if create else None,
        primary_name="max_tokens",
        default=(output_defaults or {}).get(spec.id),
    )
    cache = _cache(spec, body)
    fmt = _output_format(spec, body)
    tools = convert_tools(body)
    prefix = _prefill(body)
    turns = body.model_copy(update={"messages": body.messages[:-1]}) if prefix is not None else body
    messages = convert(
        turns, sealer=sealer, key_id=key_id, accepts_images=accepts_images, keep_thinking_from=keep_thinking_from(turns)
    )
    check_tools(tools.specs, "tools", tools.where, profile=profile, schema_field="input_schema")
    choice, parallel = convert_tool_choice(body, tools)
    if choice.name != WEB_SEARCH_NAME:
        check_tool_choice(choice, tools.specs, "tool_choice")
    check_answer_prefix(prefix, fmt, choice, tools.specs)
    visible = [] if choice.mode == "none" else tools.specs
    gen = GenerationRequest(
        model=spec.id,
        messages=tuple(messages),
        effort=effort,
        budget=budget_for(budgets, effort),
        max_output_tokens=max_out,
        tools=tuple(visible),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        output_format=fmt,
        cache=cache_policy(spec, cache, key_id),
        stop=_stop_sequences(create) if create else (),
        prompt_param="messages",
        reasoning=reasoning,
        answer_prefix=prefix,
    )
    metadata = create.metadata if create else None
    search = tools.web_search if visible else None
    user_id = metadata.user_id if metadata else None
    return MessagesPlan(gen, spec.id, show_thinking, search, user_id, key_id, bool(create and create.stream))


def build_messages_plan(
    body: MessagesRequest,
    *,
    served: frozenset[str],
    budgets: Mapping[str, Any],
    key_id: str,
    accepts_images: bool,
    sealer: Sealer,
    output_defaults: Mapping[str, int] | None = None,
    contracts: Mapping[str, ContractProfile] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> MessagesPlan:
    """``POST /v1/messages``: everything the answer needs. ``aliases``: model ids clients
    ask for (``claude-haiku-4-5``) -> a served model id."""
    return _build(
        body,
        body,
        served=served,
        budgets=budgets,
        key_id=key_id,
        accepts_images=accepts_images,
        sealer=sealer,
        output_defaults=output_defaults,
        contracts=contracts,
        aliases=aliases,
    )


def build_count_tokens_plan(
    body: CountTokensRequest,
    *,
    served: frozenset[str],
    budgets: Mapping[str, Any],
    key_id: str,
    accepts_images: bool,
    sealer: Sealer,
    output_defaults: Mapping[str, int] | None = None,
    contracts: Mapping[str, ContractProfile] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> MessagesPlan:
    """``POST /v1/messages/count_tokens``: the plan ``create`` would build for the same body
    (its prompt is the one billed), with the default output cap in place of ``max_tokens``."""
    return _build(
        body,
        None,
        served=served,
        budgets=budgets,
        key_id=key_id,
        accepts_images=accepts_images,
        sealer=sealer,
        output_defaults=output_defaults,
        contracts=contracts,
        aliases=aliases,
    )
