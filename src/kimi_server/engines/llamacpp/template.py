"""Renders a conversation into a raw prompt with the model's own chat template (Jinja).

The template comes from the GGUF file the operator chose; it still runs in Jinja's immutable
sandbox so a hostile file cannot reach Python internals.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kimi_server.engines.llamacpp.multimodal import marked_text
from kimi_server.engines.types import Message, ToolSpec
from kimi_server.errors import InvalidRequestError

# Used when a GGUF carries no template: plain ChatML, which most small instruct models follow.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Stands for a system prompt while the template's tool block is cut out (tool_block).
_MARK = "\u0000kimi-system-prompt\u0000"


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _arguments_value(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _tool_text(tools: Sequence[ToolSpec]) -> str:
    lines = [
        "You can call these tools. To call one, answer with a JSON object "
        '{"name": <tool name>, "arguments": <arguments object>}.',
    ]
    for tool in tools:
        lines.append(_tojson(_tool_dict(tool)))
    return "\n".join(lines)


# Told to the model with a custom (freeform) tool: its call is the patch text itself.
PATCH_HINT = (
    "Call it by writing the patch itself, not JSON: '*** Begin Patch', then per file "
    "'*** Add File: PATH' with '+' lines, '*** Delete File: PATH', or '*** Update File: PATH' "
    "with '@@' hunks of ' ', '-' and '+' lines, then '*** End Patch'."
)


def _tool_dict(tool: ToolSpec) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": tool.name}
    if tool.kind == "custom":
        fn["description"] = " ".join(filter(None, (tool.description, PATCH_HINT)))
        fn["parameters"] = {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}
    if tool.description:
        fn["description"] = tool.description
    fn["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(self.source)
        self._bos, self._eos = bos_token, eos_token
        self.native_tools = "tools" in self.source

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolSpec] = (),
        history_reasoning: tuple[str, str] | None = None,
    ) -> str:
        """The prompt up to and including the assistant turn's opening.

        ``history_reasoning`` (opener, closer) wraps earlier assistant reasoning so the model
        sees its own past thinking in the form it is asked to produce now; without it, earlier
        reasoning is left out.
        """
        wire = [self._message_dict(m, history_reasoning) for m in messages]
        context: dict[str, Any] = {
            "messages": wire,
            "add_generation_prompt": True,
            "bos_token": self._bos,
            "eos_token": self._eos,
        }
        # Tools a system message declares are rendered there (_message_dict), not up front.
        declared = {t.name for m in messages for t in m.tools}
        fn_tools = [t for t in tools if t.kind in ("function", "custom", "web_search") and t.name not in declared]
        if fn_tools and self.native_tools:
            context["tools"] = [_tool_dict(t) for t in fn_tools]
        elif fn_tools:
            self._inject_tool_text(wire, fn_tools)
        try:
            return str(self._template.render(**context))
        except TemplateError as exc:
            raise InvalidRequestError(
                f"The conversation cannot be rendered by this model's chat template: {exc}",
                param="messages",
            ) from None

    def tool_block(self, tools: Sequence[ToolSpec]) -> str:
        """The text a system message that declares ``tools`` carries: the template's own tool
        block (what it writes after a system prompt when given tools), so the model reads the
        declaration as it was trained to, at the point where it was made. A template that
        puts its tool block elsewhere (or has none) gets the plain description."""
        if not self.native_tools:
            return _tool_text(tools)
        probe = [{"role": "system", "content": _MARK}, {"role": "user", "content": "?"}]
        base = {"messages": probe, "add_generation_prompt": False, "bos_token": self._bos, "eos_token": self._eos}
        try:
            with_tools = str(self._template.render(**base, tools=[_tool_dict(t) for t in tools]))
            without = str(self._template.render(**base))
        except TemplateError:
            return _tool_text(tools)
        _, found, after = with_tools.partition(_MARK)
        _, _, tail = without.partition(_MARK)
        block = after[: len(after) - len(tail)].strip() if found and after.endswith(tail) else ""
        return block or _tool_text(tools)

    def _inject_tool_text(self, wire: list[dict[str, Any]], tools: Sequence[ToolSpec]) -> None:
        self._inject_system(wire, _tool_text(tools))

    @staticmethod
    def _inject_system(wire: list[dict[str, Any]], text: str) -> None:
        if wire and wire[0]["role"] == "system":
            wire[0]["content"] = f"{wire[0]['content']}\n\n{text}"
        else:
            wire.insert(0, {"role": "system", "content": text})

    def _message_dict(self, message: Message, history_reasoning: tuple[str, str] | None) -> dict[str, Any]:
        content = marked_text(message.text, message.images) if message.images else message.text
        if message.tools:
            content = self.tool_block(message.tools)
        out: dict[str, Any] = {"role": message.role, "content": content}
        if message.role == "assistant":
            if message.reasoning and history_reasoning:
                opener, closer = history_reasoning
                content = f"{opener}{message.reasoning}{closer}{content}"
            if message.tool_calls:
                calls = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": _arguments_value(c.arguments)},
                    }
                    for c in message.tool_calls
                ]
                # Rendered as the engine generated them (see grammar.CallSyntax), so the
                # next turn's prompt repeats this turn's tokens and its prompt cache holds.
                if self.native_tools:
                    out["tool_calls"] = calls
                    if not message.text and content.endswith("\n"):
                        content = content[:-1]  # the template puts its own newline back
                else:
                    rendered = "\n".join(
                        _tojson({"name": c.name, "arguments": _arguments_value(c.arguments)})
                        for c in message.tool_calls
                    )
                    glue = "" if not content or content.endswith("\n") else "\n"
                    content = f"{content}{glue}{rendered}"
            out["content"] = content
        if message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
            if message.name:
                out["name"] = message.name
        return out
