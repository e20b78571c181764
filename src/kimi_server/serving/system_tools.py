"""Tools declared in a system message ("dynamic tools"), shared by both endpoints.

A system (or developer) message may carry ``tools`` instead of text: those tools are callable
from that point of the conversation on, in the same definition format as the request's own
(Chat Completions: ``{"type": "function", "function": {...}}``; Responses: the flat
``{"type": "function", "name": ...}``). Here each declaration is checked for its shape, with
errors naming the exact field; names, duplicates and schemas are checked with the request's
tools, as one set (``serving/common.py:check_tools``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from kimi_server.engines.types import Message, ToolSpec
from kimi_server.errors import InvalidRequestError
from kimi_server.policy import rules
from kimi_server.policy.profiles import ContractProfile

SYSTEM_ROLES = ("system", "developer")


def _bad(param: str, message: str, code: str = "invalid_value") -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _missing(param: str) -> InvalidRequestError:
    return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)


def _text_field(obj: dict[str, Any], key: str, at: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{at}.{key}", f"'{at}.{key}' must be a string.")
    return value


def _check_function_type(entry: object, at: str) -> dict[str, Any]:
    """The entry as a tool object whose ``type`` is "function"."""
    if not isinstance(entry, dict):
        raise _bad(at, f"'{at}' must be a tool object.")
    if "type" not in entry:
        raise _missing(f"{at}.type")
    if entry["type"] != "function":
        hint = (
            " Declare web search in the request's 'tools'."
            if entry["type"] in ("web_search", "builtin_function")
            else ""
        )
        raise _bad(
            f"{at}.type",
            f"Invalid value for '{at}.type': {_shown(entry['type'])}. A system message "
            f"declares function tools only: expected 'function'.{hint}",
        )
    return entry


def _definition(entry: dict[str, Any], at: str, *, nested: bool) -> tuple[dict[str, Any], str]:
    """The function's definition and its place: the entry itself, or (chat) its ``function``."""
    if not nested:
        return entry, at
    where = f"{at}.function"
    if "function" not in entry:
        raise _missing(where)
    fn = entry["function"]
    if not isinstance(fn, dict):
        raise _bad(where, f"'{where}' must be an object holding the function's definition.")
    return fn, where


def _entry(entry: object, at: str, *, nested: bool, strict_default: bool) -> ToolSpec:
    """One declared tool. ``nested``: the chat shape, the definition under ``function``."""
    fn, where = _definition(_check_function_type(entry, at), at, nested=nested)
    if "name" not in fn:
        raise _missing(f"{where}.name")
    name = fn["name"]
    if not isinstance(name, str):
        raise _bad(f"{where}.name", f"'{where}.name' must be a string.")
    description = _text_field(fn, "description", where)
    parameters = fn.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad(f"{where}.parameters", f"'{where}.parameters' must be a JSON Schema object.")
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _bad(f"{where}.strict", f"'{where}.strict' must be a boolean.")
    return ToolSpec(
        name,
        description,
        parameters,
        strict_default if strict is None else strict,
        "function",
        where=where,
    )


def declared_tools(
    raw: object,
    *,
    role: str,
    content_empty: bool,
    at: str,
    profile: ContractProfile,
    nested: bool,
    strict_default: bool,
) -> tuple[ToolSpec, ...]:
    """The tools one message declares; ``raw`` is its ``tools`` value (not None), ``at`` the
    message's place (``messages[2]``, ``input[0]``)."""
    param = f"{at}.tools"
    if role not in SYSTEM_ROLES:
        raise _bad(
            param,
            f"'{param}': only a system or developer message may declare tools; this is a "
            f"{role!r} message. Declare the tools in the request's 'tools' or in a system "
            "message of their own.",
        )
    rules.check_system_tools(profile, param=param)
    if not content_empty:
        raise _bad(
            f"{at}.content",
            f"'{at}' declares tools and also has content: a system message that declares "
            "tools carries the tools only. Put its text in a system message of its own.",
        )
    if not isinstance(raw, list):
        raise _bad(param, f"'{param}' must be an array of tool objects.")
    return tuple(
        _entry(entry, f"{param}[{j}]", nested=nested, strict_default=strict_default) for j, entry in enumerate(raw)
    )


def declarations(messages: Iterable[Message]) -> list[ToolSpec]:
    """Every tool the conversation's system messages declare, in order."""
    return [tool for m in messages for tool in m.tools]


def in_force(messages: Sequence[Message], visible: Sequence[ToolSpec]) -> tuple[Message, ...]:
    """The conversation with each declaration cut to the tools the model may see (all of them,
    or those ``tool_choice`` allows; none under "none"): a declaration left empty is dropped,
    as the request's own tools are hidden under "none"."""
    names = {t.name for t in visible}
    out: list[Message] = []
    for m in messages:
        if not m.tools:
            out.append(m)
            continue
        kept = tuple(t for t in m.tools if t.name in names)
        if kept:
            out.append(m if len(kept) == len(m.tools) else replace(m, tools=kept))
    return tuple(out)
