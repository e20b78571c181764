"""Closing a JSON answer that was cut (by the output cap or the repetition guard): the text that,
appended, makes it one JSON value, valid under its schema where there is one.

The answer was decoded under a grammar, so the cut text is the start of a valid value. The
closing finishes the open string, number or literal (an unfinished key becomes a property the
schema names), gives a member or item still waiting for its value a short one, adds the
required properties and the ``minItems`` items still missing, and closes each open container,
innermost first. Where ``anyOf``/``oneOf`` leave the branch open, each likely branch is tried
and the first closing the whole value validates under is taken; failing all, the first one (it
still parses). Only text is appended: what was cut has already been sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators

from kimi_server.parsers.json_prefix import JsonPrefix, scan_json_prefix
from kimi_server.parsers.schema_fill import (
    Budget,
    OutOfBudget,
    dumps,
    finish_number,
    finish_string,
    minimal,
)
from kimi_server.parsers.schema_nav import Schema, allows, alternatives, item, member, required

MAX_CANDIDATES = 16  # closings checked against the schema before the first is taken as it is
PATTERN_TIMEOUT_S = 0.05  # one pattern checked in a validation


def close_json(text: str, schema: Schema | None = None, *, budget: Budget | None = None) -> str | None:
    """What to append to ``text`` so it is one JSON value (valid under ``schema`` where one is
    given and a closing is found); "" when it is one already; None when no JSON value begins
    with ``text``."""
    prefix = scan_json_prefix(text) if text.strip() else None
    if prefix is None:
        return None
    if prefix.complete:
        return ""
    root: Schema = schema if schema is not None else {}
    valid = _validator(root)
    budget = budget or Budget()
    first: str | None = None
    try:
        for n, closing in enumerate(_closings(prefix, root, budget)):
            if valid(text + closing):
                return closing
            first = closing if first is None else first
            if n + 1 >= MAX_CANDIDATES or budget.expired:
                break
    except OutOfBudget:
        pass
    if first is not None:
        return first
    return next(_closings(prefix, {}, Budget()))  # the schema gave no closing: syntax alone


def _pattern(validator: Any, pattern: str, instance: Any, schema: Schema) -> Iterator[ValidationError]:
    """``pattern`` in the grammar's dialect (the ``regex`` module reads ``\\p{L}``), and bounded:
    Python's ``re`` may backtrack for ever on a hostile pattern the closing did not satisfy."""
    if not validator.is_type(instance, "string"):
        return
    try:
        found = regex.search(pattern, instance, timeout=PATTERN_TIMEOUT_S)
    except (regex.error, TimeoutError):
        found = None
    if found is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Checker = validators.extend(Draft202012Validator, {"pattern": _pattern})


def _validator(schema: Schema) -> Callable[[str], bool]:
    checker = _Checker(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)

    def valid(text: str) -> bool:
        try:
            return bool(checker.is_valid(json.loads(text)))
        except Exception:  # a schema the validator cannot apply (a regex it cannot read): unconfirmed
            return False

    return valid


def _closings(prefix: JsonPrefix, root: Schema, budget: Budget) -> Iterator[str]:
    for path, pending in _paths(prefix, root, root, 0):
        for head, added in _pending(prefix, path, pending, root, budget):
            yield head + _close_containers(prefix, path, added, root, budget)


def _paths(prefix: JsonPrefix, root: Schema, node: Any, level: int) -> Iterator[tuple[list[Schema], Any]]:
    """The plain schemas the open containers from ``level`` inwards may be under, with the
    schema of the value pending in the innermost (None where none is)."""
    if level == len(prefix.frames):
        yield [], node
        return
    kind = prefix.frames[level]
    for plain in alternatives(node, root):
        if not allows(plain, kind):
            continue
        if kind == "object" and any(member(plain, key) is None for key in prefix.keys[level]):
            continue
        for rest, pending in _paths(prefix, root, _child(prefix, level, plain), level + 1):
            yield [plain, *rest], pending


def _child(prefix: JsonPrefix, level: int, plain: Schema) -> Any:
    """The schema of the value being written inside the container at ``level``."""
    if prefix.frames[level] == "object":
        keys = prefix.keys[level]
        return member(plain, keys[-1]) if keys else None
    innermost = level == len(prefix.frames) - 1
    index = prefix.counts[level] - (0 if innermost and prefix.state == "value" else 1)
    return item(plain, index) if index >= 0 else None


def _spaced(prefix: JsonPrefix) -> str:
    """The space the canonical layout puts after ':' and ',' (already there, or none due)."""
    return "" if prefix.spaced or not prefix.frames else " "


def _value(node: Any, root: Schema, budget: Budget) -> str:
    return minimal(node, root, budget) or "null"


def _pending(
    prefix: JsonPrefix, path: list[Schema], pending: Any, root: Schema, budget: Budget
) -> Iterator[tuple[str, str | None]]:
    """Ways to finish what the text stops inside, each with the key it adds to the innermost
    object (None: none)."""
    state, token = prefix.state, prefix.token
    if state == "string" and prefix.key:
        yield from _finish_key(prefix, path[-1], root, budget)
    elif state == "key":
        yield from _new_member(prefix, path[-1], root, budget)
    elif state == "string":
        ends = [finish_string(token, plain, budget) for plain in alternatives(pending, root) if allows(plain, "string")]
        yield from ((end, None) for end in _distinct(ends))
        yield finish_string(token, {}, budget) or '"', None
    elif state == "number":
        kind = "integer" if token.lstrip("-").isdigit() else "number"
        ends = [finish_number(token, plain) for plain in alternatives(pending, root) if allows(plain, kind)]
        yield from ((end, None) for end in _distinct(ends))
        yield ("0" if token[-1] in "-+.eE" else ""), None
    elif state == "literal":
        yield next(w for w in ("true", "false", "null") if w.startswith(token))[len(token) :], None
    elif state == "colon":
        yield ": " + _value(pending, root, budget), None
    elif state == "value":
        yield _spaced(prefix) + _value(pending, root, budget), None
    else:  # just inside "{" or "[", or after a whole value
        yield "", None


def _distinct(ends: list[str | None]) -> list[str]:
    return list(dict.fromkeys(end for end in ends if end is not None))


def _finish_key(prefix: JsonPrefix, plain: Schema, root: Schema, budget: Budget) -> Iterator[tuple[str, str | None]]:
    """An unfinished key: completed to a property the schema names (one still missing first),
    or, where other keys are allowed, closed as it is."""
    token, used = prefix.token, set(prefix.keys[-1])
    for name in _candidate_keys(plain, used):
        for enc in (json.dumps(name, ensure_ascii=False)[1:], json.dumps(name)[1:]):
            if enc.startswith(token):
                yield enc[len(token) :] + ": " + _value(member(plain, name), root, budget), name
                break
    end = finish_string(token, {}, budget) or '"'
    name = json.loads(f'"{token}{end}')
    if member(plain, name) is not None:
        yield end + ": " + _value(member(plain, name), root, budget), name


def _new_member(prefix: JsonPrefix, plain: Schema, root: Schema, budget: Budget) -> Iterator[tuple[str, str | None]]:
    """After a comma in an object: a member must follow (a missing required one first)."""
    space, used = _spaced(prefix), set(prefix.keys[-1])
    names = _candidate_keys(plain, used)
    if (member(plain, "") is not None and "" not in used) or not names:
        names.append("")  # no property left to name, but other keys are allowed
    for name in names[:4]:
        yield f"{space}{dumps(name)}: {_value(member(plain, name), root, budget)}", name


def _candidate_keys(plain: Schema, used: set[str]) -> list[str]:
    props = plain.get("properties")
    named = list(props) if isinstance(props, dict) else []
    missing = [name for name in required(plain) if name not in used]
    return [*missing, *(name for name in named if name not in used and name not in missing)]


def _close_containers(prefix: JsonPrefix, path: list[Schema], added: str | None, root: Schema, budget: Budget) -> str:
    """Closes every open container, innermost first, with the required members and the items
    it still lacks."""
    out: list[str] = []
    innermost = len(prefix.frames) - 1
    for level in range(innermost, -1, -1):
        plain, count = path[level], prefix.counts[level]
        if prefix.frames[level] == "object":
            used = {*prefix.keys[level], *([added] if level == innermost and added is not None else [])}
            count = max(count, len(used))
            for name in required(plain):
                if name not in used:
                    out.append(f"{', ' if count else ''}{dumps(name)}: {_value(member(plain, name), root, budget)}")
                    count += 1
            out.append("}")
        else:
            if level == innermost and prefix.state == "value":
                count += 1  # the item the pending value filled
            for index in range(count, int(plain.get("minItems", 0))):
                out.append(f"{', ' if index else ''}{_value(item(plain, index), root, budget)}")
            out.append("]")
    return "".join(out)
