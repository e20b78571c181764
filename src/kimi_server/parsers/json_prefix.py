"""Where a prefix of a JSON text stops: the one scan behind Partial Mode under a JSON output
format, and behind closing a JSON answer the output cap cut (parsers/json_closing.py). A front
refuses a prefix no JSON value begins with; the embedded engine builds the grammar of what may
follow it (engines/llamacpp/prefix_grammar.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

Frame = Literal["object", "array"]
# What the prefix stops at: a value expected ("value"), just after "[" or "{", a key expected
# after a comma ("key"), a ":" expected ("colon"), a finished value ("after"), or inside a
# string, number or literal (``token`` holds its text so far, the opening quote excluded).
State = Literal["value", "array_open", "object_open", "key", "colon", "after", "string", "number", "literal"]

_SPACE = " \t\n\r"
_LITERALS = ("true", "false", "null")
_NUMBER_CHARS = frozenset("0123456789+-.eE")


@dataclass(frozen=True)
class JsonPrefix:
    frames: tuple[Frame, ...]  # the open containers, outermost first
    state: State
    token: str = ""  # the unfinished string, number or literal
    key: bool = False  # the unfinished string is an object's key
    top: str = ""  # the first character of the top-level value ("" while none)
    spaced: bool = False  # the prefix ends in whitespace
    # Per open container, outermost first: an object's keys so far (the last may still wait for
    # its value), and how many members (keys, or an array's items) it has begun.
    keys: tuple[tuple[str, ...], ...] = ()
    counts: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        """The prefix is a whole JSON value already: nothing may follow it."""
        return not self.frames and self.state == "after"


class _Invalid(Exception):
    pass


def scan_json_prefix(text: str) -> JsonPrefix | None:
    """The state after ``text``, or None when no JSON text begins with it."""
    try:
        return _Scanner().run(text)
    except _Invalid:
        return None


# A number's text so far: what JSON's number grammar allows a number to begin with.
_NUMBER_START = re.compile(r"-?(0|[1-9][0-9]*)?((?<=[0-9])\.[0-9]*)?((?<=[0-9])[eE][+-]?[0-9]*)?")


def _valid_number_start(token: str) -> bool:
    return _NUMBER_START.fullmatch(token) is not None


class _Scanner:
    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.state: State = "value"
        self.token = ""
        self.key = False
        self.top = ""
        self.keys: list[list[str]] = []
        self.counts: list[int] = []

    def run(self, text: str) -> JsonPrefix:
        for ch in text:
            self.step(ch)
        if self.state == "number" and not _valid_number_start(self.token):
            raise _Invalid
        return JsonPrefix(
            tuple(self.frames),
            self.state,
            self.token,
            self.key and self.state == "string",
            self.top,
            bool(text) and text[-1] in _SPACE,
            tuple(tuple(k) for k in self.keys),
            tuple(self.counts),
        )

    def step(self, ch: str) -> None:
        state = self.state
        if state == "string":
            self._in_string(ch)
        elif state == "number":
            self._in_number(ch)
        elif state == "literal":
            self._in_literal(ch)
        elif ch not in _SPACE:
            self._structural(ch)

    def _in_number(self, ch: str) -> None:
        if ch in _NUMBER_CHARS:
            self.token += ch
            if not _valid_number_start(self.token):
                raise _Invalid
            return
        if self.token[-1] in "-+.eE":
            raise _Invalid  # a number cannot end there
        self._finish_value()
        self.step(ch)

    def _in_literal(self, ch: str) -> None:
        self.token += ch
        if not any(word.startswith(self.token) for word in _LITERALS):
            raise _Invalid
        if self.token in _LITERALS:
            self._finish_value()

    def _structural(self, ch: str) -> None:
        state = self.state
        if state in ("value", "array_open"):
            if ch == "]" and state == "array_open":
                self._close("array")
            else:
                self._begin_value(ch)
        elif state in ("object_open", "key"):
            if ch == "}" and state == "object_open":
                self._close("object")
            elif ch == '"':
                self.state, self.token, self.key = "string", "", True
                self.counts[-1] += 1
            else:
                raise _Invalid
        elif state == "colon":
            if ch != ":":
                raise _Invalid
            self.state = "value"
        else:  # after a value
            self._after_value(ch)

    def _begin_value(self, ch: str) -> None:
        if not self.frames and self.top:
            raise _Invalid  # a second top-level value
        if not self.frames:
            self.top = ch
        elif self.frames[-1] == "array":
            self.counts[-1] += 1
        if ch in "{[":
            self.frames.append("object" if ch == "{" else "array")
            self.state = "object_open" if ch == "{" else "array_open"
            self.keys.append([])
            self.counts.append(0)
        elif ch == '"':
            self.state, self.token, self.key = "string", "", False
        elif ch == "-" or ch.isdigit():
            self.state, self.token = "number", ch
        elif any(word.startswith(ch) for word in _LITERALS):
            self.state, self.token = "literal", ch
        else:
            raise _Invalid

    def _in_string(self, ch: str) -> None:
        token = self.token
        if ord(ch) < 0x20:
            raise _Invalid
        escape = open_escape(token)
        if escape is None:
            if ch == '"':
                if self.key:
                    self.keys[-1].append(json.loads(f'"{token}"'))
                    self.state, self.token = "colon", ""
                else:
                    self._finish_value()
                return
        elif escape == "":
            if ch not in '"\\/bfnrtu':
                raise _Invalid
        elif ch not in "0123456789abcdefABCDEF":
            raise _Invalid
        self.token = token + ch

    def _finish_value(self) -> None:
        self.state, self.token = "after", ""

    def _close(self, frame: Frame) -> None:
        if not self.frames or self.frames[-1] != frame:
            raise _Invalid
        self.frames.pop()
        self.keys.pop()
        self.counts.pop()
        self._finish_value()

    def _after_value(self, ch: str) -> None:
        if not self.frames:
            raise _Invalid  # text after the whole value
        inner = self.frames[-1]
        if ch == ",":
            self.state = "key" if inner == "object" else "value"
        elif ch == "}" and inner == "object":
            self._close("object")
        elif ch == "]" and inner == "array":
            self._close("array")
        else:
            raise _Invalid


def open_escape(token: str) -> str | None:
    """The escape a string's text so far ends inside: None (none), "" (just after the
    backslash) or "u" plus the hex digits so far."""
    if _backslashes(token) % 2 == 1:
        return ""
    for width in range(4):
        at = len(token) - 2 - width
        if at < 0:
            break
        if token[at : at + 2] == "\\u" and _backslashes(token[:at]) % 2 == 0:
            return "u" + token[at + 2 :]
    return None


def _backslashes(text: str) -> int:
    """The backslashes ``text`` ends with: an odd run leaves the last one escaping."""
    return len(text) - len(text.rstrip("\\"))
