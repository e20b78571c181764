"""Responses ``input`` items -> the conversation as internal Messages.

An assistant turn arrives as several items (reasoning, then a message and/or tool calls); they
are gathered back into one assistant Message so the model sees its own turn whole, with the
reasoning restored from the sealed ``encrypted_content``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kimi_server.engines.types import ContentPart, Message, ToolCallRecord, ToolSpec
from kimi_server.errors import InvalidRequestError
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile
from kimi_server.protocol.responses import (
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputItem,
    InputText,
    MessageItem,
    OutputText,
    ReasoningItem,
    Refusal,
    ToolOutput,
    WebSearchCallItem,
)
from kimi_server.serving.system_tools import declared_tools

ALLOWED_PARTS = {
    "user": ("input_text", "input_image"),
    "system": ("input_text",),
    "developer": ("input_text",),
    "assistant": ("output_text", "refusal"),
}


@dataclass
class _AssistantTurn:
    reasoning: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.reasoning or self.texts or self.calls)

    def message(self) -> Message:
        return Message(
            "assistant",
            "\n".join(self.texts),
            reasoning="\n".join(self.reasoning) if self.reasoning else None,
            tool_calls=tuple(self.calls),
        )


def _image(part: InputImage, where: str, accepts_images: bool) -> str:
    if not accepts_images:
        raise InvalidRequestError(
            f"This model cannot see images: '{where}' is an input_image part. Send text only: "
            "the models this server runs read text.",
            param=where,
            code="unsupported_content",
        )
    if not part.image_url:
        raise InvalidRequestError(
            f"'{where}' needs an 'image_url' (an https or data URL); file ids are not supported "
            "because this server stores no files.",
            param=f"{where}.image_url",
        )
    return part.image_url


def _message(item: MessageItem, where: str, accepts_images: bool) -> Message:
    parts: list[ContentPart] = []
    if item.content is None:
        if item.tools is None:
            raise InvalidRequestError(f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
    elif isinstance(item.content, str):
        parts.append(ContentPart("text", item.content))
    else:
        allowed = ALLOWED_PARTS[item.role]
        for j, part in enumerate(item.content):
            at = f"{where}.content[{j}]"
            if part.type not in allowed:
                raise InvalidRequestError(
                    f"Invalid '{at}.type': a '{item.role}' message may contain only "
                    f"{' and '.join(repr(a) for a in allowed)} parts, not {part.type!r}.",
                    param=f"{at}.type",
                    code="invalid_value",
                )
            if isinstance(part, InputText | OutputText):
                parts.append(ContentPart("text", part.text))
            elif isinstance(part, Refusal):
                parts.append(ContentPart("text", part.refusal))
            else:
                parts.append(ContentPart("image", _image(part, at, accepts_images)))
    role = "system" if item.role == "developer" else item.role
    return Message.of_parts(role, parts)


def _tool_output(output: ToolOutput, call_id: str, where: str, accepts_images: bool) -> Message:
    if isinstance(output, str):
        return Message("tool", output, tool_call_id=call_id)
    parts = [
        ContentPart("text", part.text)
        if isinstance(part, InputText)
        else ContentPart("image", _image(part, f"{where}.output[{j}]", accepts_images))
        for j, part in enumerate(output)
    ]
    return Message.of_parts("tool", parts, tool_call_id=call_id)


def _declared(item: MessageItem, where: str, profile: ContractProfile) -> tuple[ToolSpec, ...]:
    content = item.content
    empty = (
        not content
        if isinstance(content, str)
        else all(isinstance(part, InputText) and not part.text for part in content or ())
    )
    # Responses tools are flat ({"type": "function", "name": ...}) and strict unless told not.
    return declared_tools(
        item.tools,
        role=item.role,
        content_empty=empty,
        at=where,
        profile=profile,
        nested=False,
        strict_default=True,
    )


@dataclass
class _Converter:
    """Input items to Messages, gathering each assistant turn's items into one Message."""

    accepts_images: bool
    open_reasoning: Callable[[str, str], str]
    flat_name: Callable[[str, str | None], str]
    profile: ContractProfile
    out: list[Message] = field(default_factory=list)
    turn: _AssistantTurn = field(default_factory=_AssistantTurn)

    def flush(self) -> None:
        if not self.turn.empty():
            self.out.append(self.turn.message())
        self.turn = _AssistantTurn()

    def add(self, item: InputItem, where: str) -> None:
        if isinstance(item, WebSearchCallItem):
            return  # history only: its results are not kept
        if isinstance(item, ReasoningItem):
            self._reasoning(item, where)
        elif isinstance(item, MessageItem) and item.role == "assistant":
            self._assistant(item, where)
        elif isinstance(item, FunctionCallItem):
            name = self.flat_name(item.name, item.namespace)
            self.turn.calls.append(ToolCallRecord(item.call_id, name, item.arguments))
        elif isinstance(item, CustomToolCallItem):
            self.turn.calls.append(ToolCallRecord(item.call_id, item.name, item.input, kind="custom"))
        else:
            self.flush()
            self._outside_turn(item, where)

    def _reasoning(self, item: ReasoningItem, where: str) -> None:
        if item.encrypted_content is None:
            raise InvalidRequestError(
                f"'{where}' is a reasoning item without 'encrypted_content'. This server keeps "
                "no state and restores reasoning only from it: send the item as returned.",
                param=f"{where}.encrypted_content",
            )
        if self.turn.texts or self.turn.calls:
            self.flush()  # reasoning opens a new assistant turn
        blob = item.encrypted_content
        self.turn.reasoning.append(self.open_reasoning(blob, f"{where}.encrypted_content"))

    def _assistant(self, item: MessageItem, where: str) -> None:
        if item.tools is not None:
            _declared(item, where, self.profile)  # refused: only system items declare tools
        if self.turn.texts or self.turn.calls:
            self.flush()
        self.turn.texts.append(_message(item, where, self.accepts_images).text)

    def _outside_turn(self, item: InputItem, where: str) -> None:
        """A user, system or developer message, or a tool's output: a Message of its own."""
        if isinstance(item, MessageItem):
            message = _message(item, where, self.accepts_images)
            if item.tools is not None:
                message = replace(message, tools=_declared(item, where, self.profile))
            self.out.append(message)
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            self.out.append(_tool_output(item.output, item.call_id, where, self.accepts_images))


def convert_items(
    items: list[InputItem],
    *,
    accepts_images: bool,
    open_reasoning: Callable[[str, str], str],
    flat_name: Callable[[str, str | None], str],
    profile: ContractProfile = DEFAULT_PROFILE,
) -> list[Message]:
    converter = _Converter(accepts_images, open_reasoning, flat_name, profile)
    for i, item in enumerate(items):
        converter.add(item, f"input[{i}]")
    converter.flush()
    return converter.out
