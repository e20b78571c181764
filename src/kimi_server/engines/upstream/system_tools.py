"""Tools declared in a system message, as each upstream dialect takes them.

``Dialect.system_tools`` says how: Moonshot's API reads a system message's ``tools`` itself;
vLLM hands the message to the model's chat template (Kimi's reads them there) but needs the
tools in the request too for ``tool_choice`` and its tool parser; every other engine gets them
lifted into the request's ``tools``, with a line of text where they were declared, so the model
still learns when they became available.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from kimi_server.engines.types import GenerationRequest, Message, ToolSpec


class SystemTools(Enum):
    NATIVE = "native"  # the message keeps its tools; the request lists only its own
    MIRRORED = "mirrored"  # the message keeps its tools and the request lists them as well
    LIFTED = "lifted"  # the request lists them; the message names them in words


def lifted_note(tools: tuple[ToolSpec, ...]) -> str:
    names = ", ".join(t.name for t in tools)
    return f"From here on you may also call these tools (defined with the others): {names}."


def message_fields(msg: Message, mode: SystemTools, tool_json: Callable[[ToolSpec], dict[str, Any]]) -> dict[str, Any]:
    """What replaces a declaring system message's fields in the upstream body (else nothing)."""
    if not msg.tools:
        return {}
    if mode is SystemTools.LIFTED:
        return {"content": lifted_note(msg.tools)}
    return {"content": "", "tools": [tool_json(t) for t in msg.tools]}


def request_tools(req: GenerationRequest, mode: SystemTools) -> tuple[ToolSpec, ...]:
    """The tools the request's own ``tools`` field lists under ``mode``."""
    if mode is not SystemTools.NATIVE:
        return req.tools
    declared = {t.name for m in req.messages for t in m.tools}
    return tuple(t for t in req.tools if t.name not in declared)
