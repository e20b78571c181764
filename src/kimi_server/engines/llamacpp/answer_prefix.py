"""Partial Mode on the embedded engine: the text the answer continues, and the grammar a JSON
answer continues under.

The prefix follows the assistant turn's opening in the prompt, after the speaker's name where
the client gave one ("Name: "), so the model speaks as that character and goes on from the
prefix. Under ``json_object`` the grammar is the rest of the value after the prefix
(prefix_grammar.py). A ``json_schema`` grammar cannot be entered part-way: there the prefix may
only be the opening bracket every value of the schema starts with, which the grammar then
writes itself and the answer drops again (``echo``).
"""

from __future__ import annotations

from kimi_server.engines.llamacpp.grammar import Grammar
from kimi_server.engines.llamacpp.prefix_grammar import continuation_grammar
from kimi_server.engines.types import AnswerPrefix, GenerationRequest
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.json_prefix import scan_json_prefix

_OPENERS = {"object": "{", "array": "["}


def lead_text(prefix: AnswerPrefix | None, echo: str = "") -> str:
    """What the prompt ends with after the assistant turn's opening: the speaker's name, then
    the client's prefix up to what the grammar writes itself (``echo``)."""
    if prefix is None:
        return ""
    text = prefix.text.split(echo, 1)[0] if echo else prefix.text
    if prefix.name:
        return f"{prefix.name}: {text.lstrip()}" if text.strip() else f"{prefix.name}:"
    return text


def continued(request: GenerationRequest, structured: Grammar | None) -> tuple[Grammar | None, str]:
    """The answer's grammar given the request's prefix, and the text it writes that the client
    sent already (dropped from the answer)."""
    prefix = request.answer_prefix
    if prefix is None or structured is None or not prefix.text.strip():
        return structured, ""
    scanned = scan_json_prefix(prefix.text)
    if scanned is None or scanned.complete:
        raise InvalidRequestError(
            f"'{prefix.param}': the prefix must be the beginning of a JSON value the response "
            "format allows, with something still to follow.",
            param=prefix.param,
        )
    fmt = request.output_format
    if fmt.kind == "json_object":
        return continuation_grammar(scanned), ""
    opener = _OPENERS.get(str((fmt.schema or {}).get("type")))
    if opener is not None and prefix.text.strip() == opener:
        return structured, opener
    raise InvalidRequestError(
        f"'{prefix.param}': under a json_schema response format this engine continues only a "
        f"prefix that opens the value ('{{' for an object schema, '[' for an array schema).",
        param=prefix.param,
        code="unsupported_value",
    )
