"""Short values a JSON Schema allows, and short ends for a string or number that was cut: the
pieces json_closing.py closes a cut JSON answer with.

Strings are finished by a depth-first search over a small alphabet of characters JSON writes
unescaped, pruned by partial matching (the ``regex`` module's ``partial=True``: could this
still become a match?), so a ``pattern`` or ``format`` is followed without a regex engine of
our own. Every search is bounded by a ``Budget``; a caller that runs out gets None and closes
without the schema.
"""

from __future__ import annotations

import json
import math
import operator
import re
import threading
import time
from collections import OrderedDict
from typing import Any

import regex

from kimi_server.parsers.json_prefix import open_escape
from kimi_server.parsers.schema_nav import Schema, allowed_values, alternatives, item, kinds, member, required

# '1' first: it makes valid dates, times, addresses and UUIDs where '0' would not (year 0000).
_ALPHABET = "1a0A-:.TZ+_@/ bcdefghijklmnopqrstuvwxyz23456789BCDEFGHIJKLMNOPQRSUVWXY"
_MAX_EXTENSION = 96  # characters a pattern search may add
_REGEX_TIMEOUT_S = 0.05  # one partial match; a pathological pattern gives up here

_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = "[0-9a-fA-F]"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# The shapes of the formats a strict schema may name (serving/schema_check.py), as whole matches.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "ipv6": f"({_HEX}{{1,4}}:){{7}}{_HEX}{{1,4}}|({_HEX}{{1,4}}:){{1,7}}:|::",
    "email": r"[^@\s\"\\]+@[^@\s\"\\]+",
    "hostname": rf"{_LABEL}(\.{_LABEL})*",
    "duration": r"P([0-9]+[YMWD])+(T([0-9]+[HMS])+)?|PT([0-9]+[HMS])+",
}
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_KIND_ORDER = ("null", "boolean", "integer", "number", "string", "array", "object")
_LAYOUT = {"ensure_ascii": False, "separators": (", ", ": ")}
_BOUNDS = (
    ("minimum", operator.ge),
    ("maximum", operator.le),
    ("exclusiveMinimum", operator.gt),
    ("exclusiveMaximum", operator.lt),
)


_SHORTEST: OrderedDict[tuple[Any, ...], str | None] = OrderedDict()
_SHORTEST_SIZE = 512
_SHORTEST_LOCK = threading.Lock()


class OutOfBudget(Exception):
    pass


class Budget:
    """Bounds the work of one closing: checks made and wall time."""

    def __init__(self, checks: int = 20_000, seconds: float = 0.5) -> None:
        self.checks = checks
        self.deadline = time.monotonic() + seconds

    @property
    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def spend(self) -> None:
        self.checks -= 1
        if self.checks < 0 or self.expired:
            raise OutOfBudget


def dumps(value: Any) -> str:
    """JSON in the layout the grammars write (grammar.py's canonical layout)."""
    return json.dumps(value, **_LAYOUT)  # type: ignore[arg-type]


class _StringRule:
    def __init__(self, node: Schema, budget: Budget) -> None:
        self.budget = budget
        self.min_len = int(node.get("minLength", 0))
        self.max_len = int(node.get("maxLength", 1 << 30))
        pattern, fmt = node.get("pattern"), node.get("format")
        try:
            self.pattern = regex.compile(pattern) if isinstance(pattern, str) else None
        except regex.error:
            raise OutOfBudget from None  # a pattern this search cannot read: close without it
        shape = FORMATS.get(fmt) if isinstance(fmt, str) else None
        self.shape = regex.compile(f"(?:{shape})") if shape else None

    def _match(self, text: str, *, partial: bool) -> bool:
        self.budget.spend()
        try:
            if self.pattern is not None and not self.pattern.search(text, partial=partial, timeout=_REGEX_TIMEOUT_S):
                return False
            return self.shape is None or bool(self.shape.fullmatch(text, partial=partial, timeout=_REGEX_TIMEOUT_S))
        except TimeoutError:
            raise OutOfBudget from None

    def accepts(self, text: str) -> bool:
        return self.min_len <= len(text) <= self.max_len and self._match(text, partial=False)

    def viable(self, text: str) -> bool:
        return len(text) <= self.max_len and self._match(text, partial=True)


def extend_string(text: str, node: Schema, budget: Budget) -> str | None:
    """Characters to append to the string value ``text`` so ``node``'s string rules hold."""
    rule = _StringRule(node, budget)
    if rule.pattern is None and rule.shape is None:
        pad = "a" * max(0, rule.min_len - len(text))
        return pad if len(text) + len(pad) <= rule.max_len else None
    # The shortest string of a rule comes up for each member and item under it: searched once.
    key = (node.get("pattern"), node.get("format"), rule.min_len, rule.max_len)
    with _SHORTEST_LOCK:  # closings run in worker threads
        if not text and key in _SHORTEST:
            _SHORTEST.move_to_end(key)
            return _SHORTEST[key]
    found: str | None = ""
    if not rule.accepts(text):
        room = min(rule.max_len - len(text), max(_MAX_EXTENSION, rule.min_len - len(text)))
        found = _search(text, "", room, rule) if room > 0 and rule.viable(text) else None
    if not text:
        with _SHORTEST_LOCK:
            _SHORTEST[key] = found
            if len(_SHORTEST) > _SHORTEST_SIZE:
                _SHORTEST.popitem(last=False)
    return found


def _search(text: str, added: str, room: int, rule: _StringRule) -> str | None:
    """Depth first: a character that completes the match now, else the first that keeps it
    possible, recursively (at most ``room`` characters)."""
    fits = [c for c in _ALPHABET if rule.viable(text + added + c)]
    for c in fits:
        if rule.accepts(text + added + c):
            return added + c
    if room <= 1:
        return None
    for c in fits:
        found = _search(text, added + c, room - 1, rule)
        if found is not None:
            return found
    return None


def _escape_ends(token: str) -> list[str]:
    """Ways to finish the escape a string's text ends inside (the one way, "", if none), so the
    text decodes: a complete escape, and a high surrogate given its low half."""
    escape = open_escape(token)
    if escape == "":
        return ["\\", "/", "n", "t"]
    if escape is None:
        tail = re.search(r"\\u([dD][89abAB][0-9a-fA-F]{2})$", token)
        return ["\\udc00" if tail and open_escape(token[: tail.start()]) is None else ""]
    pad = "0" * (5 - len(escape))
    code = int(escape[1:] + pad, 16)
    return [pad + "\\udc00" if 0xD800 <= code <= 0xDBFF else pad]


def finish_string(token: str, node: Schema, budget: Budget) -> str | None:
    """What closes the string whose text so far (after its opening quote) is ``token`` as a
    value ``node`` allows, closing quote included."""
    values = allowed_values(node)
    if values is not None:
        ends = [
            enc[len(token) :]
            for v in values
            if isinstance(v, str)
            for enc in (json.dumps(v, ensure_ascii=False)[1:], json.dumps(v)[1:])
            if enc.startswith(token)
        ]
        return min(ends, key=len) if ends else None
    for head in _escape_ends(token):
        try:
            text = json.loads(f'"{token}{head}"')
        except ValueError:
            continue
        tail = extend_string(text, node, budget)
        if tail is not None:
            return f'{head}{tail}"'
    return None


def number_fits(text: str, node: Schema) -> bool:
    """Whether the JSON number ``text`` is one ``node`` allows."""
    if not _NUMBER.fullmatch(text):
        return False
    value = float(text)
    if math.isinf(value):
        return False
    found = kinds(node)
    if found is not None and "number" not in found and not value.is_integer():
        return False
    for word, holds in _BOUNDS:
        bound = node.get(word)
        if isinstance(bound, (int, float)) and not isinstance(bound, bool) and not holds(value, bound):
            return False
    step = node.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0:
        quotient = value / step
        return abs(quotient - round(quotient)) < 1e-9
    return True


def _number_tails(token: str) -> list[str]:
    """Endings to try after a number's text so far, shortest first."""
    tails = {""}
    for k in range(16):
        tails.update(d + "0" * k for d in "0123456789")
        if k < 6:
            tails.update("." + "0" * k + d for d in "123456789")
    if "." in token or "e" in token.lower():
        tails = {t for t in tails if "." not in t}
    return sorted(tails, key=lambda t: (len(t), t))


def finish_number(token: str, node: Schema) -> str | None:
    """What completes the number whose text so far is ``token`` as one ``node`` allows."""
    values = allowed_values(node)
    if values is not None:
        ends = [dumps(v)[len(token) :] for v in values if _is_number(v) and dumps(v).startswith(token)]
        return min(ends, key=len) if ends else None
    for tail in _number_tails(token):
        if number_fits(token + tail, node):
            return tail
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_text(value: float) -> str:
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(round(value, 6))


def minimal_number(node: Schema) -> str | None:
    """A short number ``node`` allows: 0 where it can, else one near its bounds."""
    picks: set[float] = {0.0, 1.0, -1.0}
    bounds = [
        float(node[w])
        for w in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        if _is_number(node.get(w))
    ]
    for bound in bounds:
        low, high = math.floor(bound), math.ceil(bound)
        picks.update(float(v) for v in (low, high, low + 1, high - 1))
        picks.update(bound + sign * step for sign in (1, -1) for step in (0.5, 0.1, 0.01, 0.001, 0.0001))
    if len(bounds) >= 2:
        picks.add((min(bounds) + max(bounds)) / 2)
    texts = [_number_text(v) for v in picks]
    fitting = [t for t in texts if number_fits(t, node)]
    return min(fitting, key=lambda t: (len(t), abs(float(t)))) if fitting else None


def minimal(node: Any, root: Any, budget: Budget, depth: int = 0) -> str | None:
    """A short JSON text of a value ``node`` allows (in the canonical layout), or None."""
    if depth > 12:
        return None
    best: str | None = None
    for plain in alternatives(node, root):
        budget.spend()
        text = _minimal_plain(plain, root, budget, depth)
        if text is not None and (best is None or len(text) < len(best)):
            best = text
            if len(text) <= 4:  # nothing much shorter exists: stop looking
                break
    return best


def _minimal_plain(node: Schema, root: Any, budget: Budget, depth: int) -> str | None:
    values = allowed_values(node)
    if values is not None:
        return min((dumps(v) for v in values), key=len) if values else None
    found = kinds(node) or {"null"}
    for kind in _KIND_ORDER:
        if kind in found:
            text = _minimal_of_kind(kind, node, root, budget, depth)
            if text is not None:
                return text
    return None


def _minimal_of_kind(kind: str, node: Schema, root: Any, budget: Budget, depth: int) -> str | None:
    if kind == "null":
        return "null"
    if kind == "boolean":
        return "false"
    if kind in ("integer", "number"):
        return minimal_number({**node, "type": kind})
    if kind == "string":
        tail = extend_string("", node, budget)
        return None if tail is None else dumps(tail)
    if kind == "array":
        items = [minimal(item(node, i), root, budget, depth + 1) for i in range(int(node.get("minItems", 0)))]
        return None if None in items else "[" + ", ".join(i for i in items if i is not None) + "]"
    members = []
    for key in required(node):
        value = minimal(member(node, key), root, budget, depth + 1)
        if value is None:
            return None
        members.append(f"{dumps(key)}: {value}")
    return "{" + ", ".join(members) + "}"
