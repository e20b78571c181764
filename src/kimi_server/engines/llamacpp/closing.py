"""The end a grammar-bound answer gets when it was cut: by the output cap, the end of the
context, or the repetition guard. A structured answer or a call's arguments cut mid-value would
reach the client as JSON that does not parse; instead the answer is closed with the shortest
closing found that makes the value whole and valid under its schema (parsers/json_closing.py),
sent as its last delta, and the answer still ends with ``finish_reason: "length"``. The closing
is the server's text, not the model's: it is not counted in ``completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kimi_server.engines.cut_closing import (
    NO_PARAMETERS,
    arguments_end,
    close_answer,
    structured_schema,
    tool_parameters,
)
from kimi_server.engines.llamacpp.grammar import Grammar
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import GenerationRequest, ToolSpec

__all__ = ["answer_schema", "close_answer", "close_call"]


def answer_schema(request: GenerationRequest, grammar: Grammar | None) -> dict[str, Any] | None:
    """The schema a text answer under ``grammar`` is closed under; None: free text, not closed."""
    if grammar is None or grammar.free_text:
        return None
    return structured_schema(request) or {"type": "object"}


def close_call(parser: CallStreamParser, tools: Sequence[ToolSpec]) -> str:
    """Text that, fed to ``parser``, makes the call it is inside whole: its arguments closed
    under the tool's parameters, then the call's own end. A call not yet begun is begun only
    where no call came before (a forced call is then still a call); a custom tool's patch is
    left as it is (inventing a file operation would change files)."""
    syntax, state, pending = parser.syntax, parser.state, parser.pending
    if state == "args":
        return arguments_end(parser.arguments, tool_parameters(tools, parser.name)) + "}" + syntax.close
    if state == "args_end":
        return "}" + syntax.close
    if state == "close":
        return syntax.close[len(pending) :]
    if state == "patch" or parser.count or (state == "open" and not pending):
        return ""
    opening = syntax.open[len(pending) :] if state == "open" else ""
    written = "" if state == "open" else pending
    for tool in tools:
        if tool.kind == "custom":
            continue
        head = f'{{"name": "{tool.name}", "arguments": '
        if head.startswith(written):
            arguments = arguments_end("", tool.parameters or NO_PARAMETERS)
            return opening + head[len(written) :] + arguments + "}" + syntax.close
    return ""
