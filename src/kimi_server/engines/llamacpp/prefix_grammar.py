"""The grammar of what may follow a Partial Mode prefix under ``json_object``.

llama.cpp starts a grammar afresh at the first generated token: text in the prompt never
reaches it. So the answer cannot be "the JSON grammar, already past the prefix" by feeding the
prefix in; instead the grammar here describes the rest itself: the unfinished string, number or
literal completed, then each open container continued and closed, innermost first. Every value
still to come is any JSON value in the canonical layout (``grammar.json_block``). Prefix plus
answer is then one JSON object, whatever the prefix stopped inside.
"""

from __future__ import annotations

import json
import re

from kimi_server.engines.llamacpp.grammar import Grammar, json_block
from kimi_server.parsers.json_prefix import JsonPrefix, open_escape

# A string's characters after its opening quote, then the closing quote.
_CHAR = r'(?:[^"\\\x00-\x1F]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{4})'
_STRING_REST = rf'{_CHAR}*"'
# Bounded like grammar.py's numbers, so a small model cannot write digits until the cap.
_INT = r"(0|[1-9][0-9]{0,14})"
_FRAC = r"(\.[0-9]{1,4})?"
_EXP = r"([eE][+-]?[0-9]{1,3})?"

_RULES = (
    f"json_value: {json_block({}, strict=False)}",
    f'KEY: /"{_CHAR}*"/',
    'obj_tail: (", " KEY ": " json_value)* "}"',
    'arr_tail: (", " json_value)* "]"',
)
_TAIL = {"object": "obj_tail", "array": "arr_tail"}


def _number_rest(token: str) -> str:
    """What may follow a number's text so far (possibly nothing)."""
    if token.endswith("-") and "e" not in token.lower():
        return _INT + _FRAC + _EXP
    if token.endswith(("e", "E")):
        return r"[+-]?[0-9]{1,3}"
    if token.endswith(("e+", "e-", "E+", "E-")):
        return r"[0-9]{1,3}"
    if "e" in token.lower():
        return r"[0-9]{0,3}"
    if token.endswith("."):
        return r"[0-9]{1,4}" + _EXP
    if "." in token:
        return r"[0-9]{0,4}" + _EXP
    if token.lstrip("-") == "0":
        return _FRAC + _EXP
    return r"[0-9]{0,14}" + _FRAC + _EXP


def _string_rest(token: str) -> str:
    escape = open_escape(token)
    if escape is None:
        return _STRING_REST
    if escape == "":
        return r'(?:["\\\/bfnrt]|u[0-9a-fA-F]{4})' + _STRING_REST
    return f"[0-9a-fA-F]{{{5 - len(escape)}}}" + _STRING_REST


def _terminal(name: str, pattern: str, rules: list[str]) -> str:
    """A terminal for ``pattern``, optional where the pattern may match nothing (a terminal
    itself must match at least one character)."""
    if re.fullmatch(pattern, "") is None:
        rules.append(f"{name}: /{pattern}/")
        return name
    rules.append(f"{name}: /{pattern}/ & /(?s:.+)/")
    return f"{name}?"


def continuation_grammar(prefix: JsonPrefix) -> Grammar:
    """The grammar of the rest of a JSON value after ``prefix`` (not blank, not complete)."""
    rules = list(_RULES)
    space = "" if prefix.spaced else '" "'
    frames = list(prefix.frames)
    state = prefix.state
    pieces: list[str] = []
    if state == "string":
        pieces.append(_terminal("STRING_REST", _string_rest(prefix.token), rules))
        if prefix.key:
            pieces.append('": " json_value')
    elif state == "number":
        pieces.append(_terminal("NUMBER_REST", _number_rest(prefix.token), rules))
    elif state == "literal":
        word = next(w for w in ("true", "false", "null") if w.startswith(prefix.token))
        pieces.append(json.dumps(word[len(prefix.token) :]))
    elif state == "colon":
        pieces.append('": " json_value')
    elif state == "value":
        pieces += [space, "json_value"]
    elif state == "key":
        pieces += [space, 'KEY ": " json_value']
    elif state in ("object_open", "array_open"):
        closer = '"}"' if state == "object_open" else '"]"'
        first = 'KEY ": " json_value obj_tail' if state == "object_open" else "json_value arr_tail"
        pieces.append(f"({closer} | {first})")
        frames.pop()
    pieces += [_TAIL[frame] for frame in reversed(frames)]
    return Grammar(" ".join(p for p in pieces if p), tuple(rules))
