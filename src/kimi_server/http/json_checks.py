"""Cheap checks of a JSON body before any route parses it: nesting depth, the length of the
conversation, lone surrogates. Each costs little on a hostile body (C-speed scans of the bytes
first; the parsed value walked iteratively, so any depth is safe)."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from kimi_server.errors import InvalidRequestError
from kimi_server.http.routes import MESSAGE_LISTS
from kimi_server.policy.prompt_size import too_many_messages

NOT_PARSED: Any = object()  # check_json's parsed body when it could not parse one


def check_json(body: bytes, path: str, *, max_depth: int, max_messages: int) -> tuple[InvalidRequestError | None, Any]:
    """Depth first, then the length of the message list, then surrogates where there may be
    any. Returns the problem (None for a body that passes, or is not JSON: the route's own
    parsing answers that) and the parsed body (``NOT_PARSED`` where it was not parsed), so the
    route need not parse it again."""
    # Nesting cannot pass the number of opening brackets: most bodies skip the exact count.
    if body.count(b"[") + body.count(b"{") > max_depth and bracket_depth(body) > max_depth:
        return _too_deep(max_depth), NOT_PARSED
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None, NOT_PARSED
    param = MESSAGE_LISTS.get(path)
    listed = data.get(param) if param and isinstance(data, dict) else None
    if param and isinstance(listed, list) and len(listed) > max_messages:
        return too_many_messages(len(listed), max_messages, param), data
    if _MAYBE_SURROGATE.search(body):
        return json_problem(data, max_depth), data
    return None, data


# A lone surrogate reaches Python only as a \uD800-\uDFFF escape or as raw surrogate bytes
# (which json.loads lets through): without either, no string needs a look.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89abAB]|\\u[dD][c-fC-F]|\xed[\xa0-\xbf]")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def bracket_depth(body: bytes) -> int:
    """How deep a JSON text nests, counted on its bytes (strings removed) without parsing it."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def json_problem(data: Any, max_depth: int) -> InvalidRequestError | None:
    """The first lone surrogate or too-deep nesting in a parsed JSON value; iterative, so any
    depth is safe to inspect."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return _too_deep(max_depth)
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                return InvalidRequestError(
                    f"Invalid value for '{path or 'body'}': the string holds a lone UTF-16 "
                    "surrogate (such as \\ud800), which is not valid Unicode text.",
                    param=path or None,
                    code="invalid_unicode",
                )
        elif isinstance(node, dict):
            for key, value in node.items():
                where = f"{path}.{key}" if path else str(key)
                if _has_lone_surrogate(key):
                    return InvalidRequestError(
                        f"A field name in '{path or 'body'}' holds a lone UTF-16 surrogate.",
                        param=path or None,
                        code="invalid_unicode",
                    )
                stack.append((value, depth + 1, where))
        elif isinstance(node, list):
            stack.extend((value, depth + 1, f"{path}[{i}]") for i, value in enumerate(node))
    return None


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep(max_depth: int) -> InvalidRequestError:
    return InvalidRequestError(f"The request body nests JSON more than {max_depth} levels deep.", code="json_too_deep")
