"""Grammars for the answer phase, in llama.cpp's LLGuidance dialect (Lark with ``%json``).

Every grammar is one ``start`` rule plus named rules. JSON Schemas are inlined with ``%json``,
each tool's parameters in its own ``%json`` block so that a tool's ``#/$defs/...`` references
resolve against that tool's schema.

Tool calls are written in a syntax the engine fixes exactly (``CallSyntax``), so the streaming
parser in ``toolcalls.py`` can split name and arguments without guessing:

    OPEN {"name": "NAME", "arguments": ARGS} CLOSE        a function call
    OPEN *** Begin Patch\\n ... *** End Patch CLOSE         the custom tool apply_patch

With parallel calls allowed, up to ``MAX_PARALLEL_CALLS`` calls follow each other, separated by
a newline; otherwise exactly one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.types import ToolSpec

MAX_PARALLEL_CALLS = 4
PROBE_LITERAL = "QZXV"

# Compact, canonical JSON: free whitespace lets small models loop on newlines until the token
# budget runs out, and a fixed layout keeps streamed and non-streamed output identical.
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class CallSyntax:
    """How a call is wrapped: the model's native markers where its template has them."""

    open: str = ""
    close: str = ""
    separator: str = "\n"


QWEN_SYNTAX = CallSyntax("<tool_call>\n", "\n</tool_call>")
BARE_SYNTAX = CallSyntax()


def syntax_for_template(source: str) -> CallSyntax:
    return QWEN_SYNTAX if "<tool_call>" in source else BARE_SYNTAX


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


# Where the compiler admits text without end, a small model keeps writing digits until the token
# budget runs out mid-value. So the grammar gets a subset of what the schema allows, and every
# answer still validates and always ends:
# - "time" / "date-time": at most 6 fractional-second digits; days 01-28 so every date exists;
# - numbers: at most 4 decimals; numbers and integers without bounds: |x| < 10^15.
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
_BOUNDED_FORMATS = {"time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}
_MAGNITUDE = 10**15
_LITERAL_KEYS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas


def _bounded(node: Any) -> Any:
    if isinstance(node, list):
        return [_bounded(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _LITERAL_KEYS else _bounded(v) for k, v in node.items()}
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _BOUNDED_FORMATS and "pattern" not in node:
        del out["format"]
        out["pattern"] = _BOUNDED_FORMATS[fmt]
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "number" in kinds or "integer" in kinds:
        if "number" in kinds and "multipleOf" not in node:
            out["multipleOf"] = 0.0001
        if "minimum" not in node and "exclusiveMinimum" not in node:
            out["exclusiveMinimum"] = -_MAGNITUDE
        if "maximum" not in node and "exclusiveMaximum" not in node:
            out["exclusiveMaximum"] = _MAGNITUDE
    return out


def json_block(schema: dict[str, Any], *, strict: bool) -> str:
    schema = _bounded(schema)
    options: dict[str, Any] = dict(_LAYOUT)
    if not strict:
        # Non-strict schemas may carry keywords the grammar cannot enforce: ignore them, and
        # accept oneOf as anyOf, rather than refusing the request.
        options.update(lenient=True, coerce_one_of=True)
    body = {**schema, "x-guidance": options}
    return "%json " + json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# The patch format of apply_patch (documented in docs/tools-and-structured-output.md). Lines
# are whole lexemes so the parser never splits them; each operation names one file.
_PATCH_RULES = r"""
patch: "*** Begin Patch\n" patch_op+ "*** End Patch"
patch_op: patch_add | patch_delete | patch_update
patch_add: "*** Add File: " PATCH_PATH "\n" PATCH_PLUS*
patch_delete: "*** Delete File: " PATCH_PATH "\n"
patch_update: "*** Update File: " PATCH_PATH "\n" PATCH_MOVE? patch_hunk+
patch_hunk: PATCH_AT? PATCH_LINE+ PATCH_EOF?
PATCH_PATH: /[^\s*][^\n]*/
PATCH_MOVE: /\*\*\* Move to: [^\s*][^\n]*\n/
PATCH_AT: /@@[^\n]*\n/
PATCH_PLUS: /\+[^\n]*\n/
PATCH_LINE: /[ +\-][^\n]*\n/
PATCH_EOF: "*** End of File\n"
""".strip()


@dataclass(frozen=True)
class Grammar:
    start: str
    rules: tuple[str, ...] = ()
    free_text: bool = False  # prose, not JSON or calls: stop sequences may apply

    def text(self) -> str:
        return "\n".join(("%llguidance {}", f"start: {self.start}", *self.rules))

    def probe_text(self) -> str:
        """The same rules behind a forced literal: seeing the literal proves the grammar
        compiled (llama.cpp ignores a grammar that fails to compile and samples freely)."""
        return "\n".join(("%llguidance {}", f"start: {_lit(PROBE_LITERAL)} ({self.start})", *self.rules))


def schema_grammar(schema: dict[str, Any], *, strict: bool) -> Grammar:
    return Grammar("answer_json", (f"answer_json: {json_block(schema, strict=strict)}",))


def json_object_grammar() -> Grammar:
    return schema_grammar({"type": "object"}, strict=False)


def text_grammar(syntax: CallSyntax, tools: Sequence[ToolSpec]) -> Grammar:
    """Plain text that does not begin like a call, so a text answer never reads as one.

    Besides the template's own marker this bans the shapes small models use for calls when
    left alone: a bare JSON object and a JSON code block.
    """
    openers = [o for o in (syntax.open.strip(), "{", "```json") if o]
    if syntax == QWEN_SYNTAX:
        # After a tool result (web search) small Qwen models echo it, wrapper and all.
        openers.append("<tool_response>")
    if any(t.kind == "custom" for t in tools):
        openers.append("*** Begin Patch")
    banned = "|".join(_regex_escape(o) for o in openers)
    rule = f"ANSWER_TEXT: /(?s:.*)/ & ~/(?s:\\s*({banned}).*)/"
    return Grammar("ANSWER_TEXT", (rule,), free_text=True)


_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


def _regex_escape(text: str) -> str:
    # Only metacharacters: the Rust regex syntax reads some escaped letters and '<'/'>' as
    # assertions (word boundaries), not as the characters themselves.
    return "".join(f"\\{c}" if c in _REGEX_META else c for c in text)


def calls_grammar(syntax: CallSyntax, tools: Sequence[ToolSpec], *, parallel: bool) -> Grammar:
    """One call, or up to ``MAX_PARALLEL_CALLS`` when parallel calls are allowed."""
    rules: list[str] = []
    alternatives: list[str] = []
    for i, tool in enumerate(tools):
        if tool.kind == "custom":
            alternatives.append("patch")
            rules.append(_PATCH_RULES)
            continue
        head = _lit(f'{{"name": "{tool.name}", "arguments": ')
        params = tool.parameters or {"type": "object", "properties": {}}
        alternatives.append(f"call_{i}")
        rules.append(f'call_{i}: {head} args_{i} "}}"')
        rules.append(f"args_{i}: {json_block(params, strict=tool.strict)}")
    parts = [_lit(syntax.open)] if syntax.open else []
    parts.append(f"({' | '.join(alternatives)})")
    if syntax.close:
        parts.append(_lit(syntax.close))
    rules.append("call: " + " ".join(parts))
    if parallel and MAX_PARALLEL_CALLS > 1:
        start = f"call ({_lit(syntax.separator)} call){{0,{MAX_PARALLEL_CALLS - 1}}}"
    else:
        start = "call"
    return Grammar(start, tuple(rules))
