"""Responses request models (``POST /v1/responses``).

``input`` items are parsed here by hand rather than by one pydantic union: a message item may
omit ``type``, and errors must name the field as the client wrote it (``input[2].call_id``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from kimi_server.errors import InvalidRequestError
from kimi_server.protocol.common import PromptCacheOptions, WireModel

# --- request-level settings -------------------------------------------------------------------


class ReasoningParam(WireModel):
    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class FormatText(WireModel):
    type: Literal["text"]


class FormatJSONObject(WireModel):
    type: Literal["json_object"]


class FormatJSONSchema(WireModel):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[FormatText | FormatJSONObject | FormatJSONSchema, Field(discriminator="type")]


class TextParam(WireModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class FunctionTool(WireModel):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomTool(WireModel):
    type: Literal["custom"]
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class NamespaceTool(WireModel):
    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] = Field(min_length=1)


class WebSearchTool(WireModel):
    type: Literal["web_search"]


Tool = Annotated[FunctionTool | CustomTool | NamespaceTool | WebSearchTool, Field(discriminator="type")]


class NamedTool(WireModel):
    type: Literal["function", "custom"]
    name: str


class AllowedTools(WireModel):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"] = "auto"
    tools: list[NamedTool] = Field(min_length=1)


ToolChoiceParam = Annotated[NamedTool | AllowedTools, Field(discriminator="type")]


class ResponsesRequest(WireModel):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    stream: bool | None = False
    max_output_tokens: int | None = None
    reasoning: ReasoningParam | None = None
    text: TextParam | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    # Stateful features: accepted on the wire only to refuse them with a useful message.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None
    # Accepted and echoed (or ignored; docs/contract-responses.md says which).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Moonshot's reasoning switch, {"type": "enabled" | "disabled"}: checked by the contract
    # profile (policy/rules.py:resolve_thinking), which may also ignore it.
    thinking: Any = Field(
        default=None,
        description='Moonshot\'s switch, {"type": "enabled" | "disabled"}; it applies under the moonshot contract only',
    )


# --- input items -----------------------------------------------------------------------------


class InputText(WireModel):
    type: Literal["input_text"]
    text: str


class InputImage(WireModel):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class OutputText(WireModel):
    type: Literal["output_text"]
    text: str


class Refusal(WireModel):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[InputText | InputImage | OutputText | Refusal, Field(discriminator="type")]


class MessageItem(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    # Required, except beside ``tools`` (serving/responses_input.py says so, naming the field).
    content: str | list[Part] | None = None
    # Tools a system or developer item declares, checked in serving/system_tools.py.
    tools: Any = None


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = None


class CustomToolCallItem(WireModel):
    type: Literal["custom_tool_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: str


ToolOutput = str | list[Annotated[InputText | InputImage, Field(discriminator="type")]]


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: ToolOutput


class CustomToolCallOutputItem(WireModel):
    type: Literal["custom_tool_call_output"]
    call_id: str = Field(min_length=1)
    output: ToolOutput


class ReasoningItem(WireModel):
    type: Literal["reasoning"]
    encrypted_content: str | None = None


class WebSearchCallItem(WireModel):
    """accepted
    so output can be replayed as input; the search already shaped the message after it."""

    type: Literal["web_search_call"]
    id: str | None = None


InputItem = (
    WebSearchCallItem
    | MessageItem
    | FunctionCallItem
    | CustomToolCallItem
    | FunctionCallOutputItem
    | CustomToolCallOutputItem
    | ReasoningItem
)

ITEM_MODELS: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "custom_tool_call": CustomToolCallItem,
    "function_call_output": FunctionCallOutputItem,
    "custom_tool_call_output": CustomToolCallOutputItem,
    "reasoning": ReasoningItem,
    "web_search_call": WebSearchCallItem,
}


def _where(prefix: str, loc: tuple[int | str, ...], node: Any) -> str:
    """A pydantic location inside one item, as the client wrote it; union tags are skipped."""
    out = prefix
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
            node = node[seg] if isinstance(node, list) and seg < len(node) else None
        elif (
            isinstance(node, dict)
            and seg not in node
            and (seg == node.get("type") or "[" in seg or seg in ("str", "list"))
        ):
            continue
        elif isinstance(node, dict) or node is None:
            out += f".{seg}"
            node = node.get(seg) if isinstance(node, dict) else None
    return out


def parse_items(raw: list[Any]) -> list[InputItem]:
    items: list[InputItem] = []
    for i, obj in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(obj, dict):
            raise InvalidRequestError(f"'{where}' must be an object.", param=where)
        kind = obj.get("type", "message" if "role" in obj else None)
        if kind == "item_reference":
            raise InvalidRequestError(
                f"'{where}' is an item reference, but this server is stateless and keeps no "
                "items: send the item itself.",
                param=f"{where}.type",
                code="unsupported_value",
            )
        model = ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise InvalidRequestError(
                f"Invalid value for '{where}.type': {kind!r}. Expected one of "
                f"{', '.join(repr(k) for k in ITEM_MODELS)}.",
                param=f"{where}.type",
                code="invalid_value",
            )
        try:
            items.append(model.model_validate(obj))
        except ValidationError as exc:
            items_errors = exc.errors()
            first = max(items_errors, key=lambda e: len(e["loc"]))
            param = _where(where, tuple(first["loc"]), obj)
            if first["type"] == "missing":
                raise InvalidRequestError(f"Missing required parameter: '{param}'.", param=param) from None
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise InvalidRequestError(
                f"Invalid value for '{param}': {msg}.", param=param, code="invalid_value"
            ) from None
    return items
