"""Chat Completions request and response models (``POST /v1/chat/completions``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from kimi_server.protocol.common import JSONSchemaFormat, PromptCacheOptions, WireModel


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImageURL(WireModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(WireModel):
    type: Literal["image_url"]
    image_url: ImageURL | str


class VideoURL(WireModel):
    url: str


class VideoPart(WireModel):
    type: Literal["video_url"]
    video_url: VideoURL | str


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class FunctionCall(WireModel):
    name: str
    arguments: str


class ToolCall(WireModel):
    id: str
    type: Literal["function", "builtin_function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # Partial Mode: the last message, an assistant one, is a prefix the answer continues.
    partial: bool | None = Field(
        default=None,
        description=(
            "last assistant message only: the answer continues its content (Partial Mode); the response excludes it"
        ),
    )
    # Tools a system message declares (Moonshot's "dynamic tools"), checked field by field in
    # serving/system_tools.py so each error names its exact place.
    tools: Any = Field(
        default=None,
        description="system messages only: tools callable from this point on; the message's content is then empty",
    )

    @model_validator(mode="after")
    def _role_rules(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' requires 'tool_call_id'")
        if self.role == "assistant":
            if self.content is None and not self.tool_calls and self.tools is None:
                raise ValueError("an assistant message needs 'content' or 'tool_calls'")
        elif self.content is None and self.tools is None:
            raise ValueError(f"a message with role '{self.role}' requires 'content'")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages may carry 'tool_calls'")
        if isinstance(self.content, list) and self.role not in ("user", "system", "developer"):
            for part in self.content:
                if part.type != "text":
                    raise ValueError(f"a message with role '{self.role}' may contain only text parts")
        return self


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class WebSearchTool(WireModel):
    type: Literal["web_search"]


class BuiltinFunctionDefinition(WireModel):
    name: str


class BuiltinFunctionTool(WireModel):
    """Moonshot's original spelling of web search: ``{"type": "builtin_function", ...}``."""

    type: Literal["builtin_function"]
    function: BuiltinFunctionDefinition


ChatTool = Annotated[FunctionTool | WebSearchTool | BuiltinFunctionTool, Field(discriminator="type")]


class NamedFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormatText(WireModel):
    type: Literal["text"]


class ResponseFormatJSONObject(WireModel):
    type: Literal["json_object"]


class ResponseFormatJSONSchema(WireModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema,
    Field(discriminator="type"),
]


class StreamOptions(WireModel):
    include_usage: bool | None = None


class ChatCompletionRequest(WireModel):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    max_tokens: int | None = Field(default=None, json_schema_extra={"deprecated": True})
    reasoning_effort: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    response_format: ResponseFormat | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    # Moonshot's reasoning switch, {"type": "enabled" | "disabled"}: checked by the contract
    # profile (policy/rules.py:resolve_thinking), which may also ignore it.
    thinking: Any = Field(
        default=None,
        description='Moonshot\'s switch, {"type": "enabled" | "disabled"}; it applies under the moonshot contract only',
    )
