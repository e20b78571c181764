"""Partial Mode at the front: the client's last assistant message, marked ``partial``, is the
start of the answer, which the model continues. It leaves the conversation and becomes the
request's ``answer_prefix``, which every engine honours (or refuses with a 400) the same way.

Checked here for every engine: only the last message, an assistant one, may be partial; a
forced tool call cannot follow a text prefix; under a JSON output format the prefix must be
the beginning of a JSON value the format allows, with something still to follow.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_server.engines.types import AnswerPrefix, OutputFormat, ToolChoice, ToolSpec
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.json_prefix import scan_json_prefix
from kimi_server.protocol.chat import ChatMessage, TextPart


def chat_answer_prefix(messages: Sequence[ChatMessage]) -> AnswerPrefix | None:
    """The prefix a partial last message carries (None: no message is partial); a partial
    flag anywhere else is a 400 naming it."""
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        if not msg.partial:
            continue
        if msg.role != "assistant":
            raise InvalidRequestError(
                f"'messages[{i}].partial': only an assistant message may be partial (Partial Mode "
                "continues the answer's own text).",
                param=f"messages[{i}].partial",
            )
        if i != last:
            raise InvalidRequestError(
                f"'messages[{i}].partial': only the last message may be partial; it is the start of the answer.",
                param=f"messages[{i}].partial",
            )
    msg = messages[last]
    if not msg.partial:
        return None
    param = f"messages[{last}].partial"
    if msg.tool_calls:
        raise InvalidRequestError(
            f"'{param}': a partial message is the start of a text answer; it cannot carry 'tool_calls'.",
            param=param,
        )
    content = msg.content
    text = content if isinstance(content, str) else "".join(p.text for p in content or () if isinstance(p, TextPart))
    return AnswerPrefix(text, msg.name, param)


def check_answer_prefix(
    prefix: AnswerPrefix | None, fmt: OutputFormat, choice: ToolChoice, tools: Sequence[ToolSpec]
) -> None:
    if prefix is None:
        return
    if tools and choice.mode in ("required", "named"):
        raise InvalidRequestError(
            f"'{prefix.param}': Partial Mode cannot be combined with a forced tool call "
            "('tool_choice' required or a named function): the answer would be text.",
            param=prefix.param,
        )
    if fmt.kind == "text" or not prefix.text.strip():
        return
    scanned = scan_json_prefix(prefix.text)
    if scanned is None or scanned.complete or (fmt.kind == "json_object" and scanned.top != "{"):
        shape = "a JSON object" if fmt.kind == "json_object" else "a JSON value"
        raise InvalidRequestError(
            f"'{prefix.param}': under the JSON response format the prefix must be the beginning "
            f"of {shape}, with something still to follow.",
            param=prefix.param,
        )
