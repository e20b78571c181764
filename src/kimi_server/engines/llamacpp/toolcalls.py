"""Splits a constrained tool-call answer, as it streams, into ``ToolCallDelta`` events.

The grammar (``grammar.calls_grammar``) fixes the text exactly, so this is a small state
machine rather than a tolerant parser: it waits while a marker is only partly there and never
has to take anything back. Chunk boundaries can fall anywhere, even inside a marker or an
escape sequence; the events are the same whatever the chunking, except for how the arguments
are cut into fragments.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Literal

from kimi_server.engines.llamacpp.grammar import CallSyntax
from kimi_server.engines.types import ToolCallDelta
from kimi_server.parsers.partial import partial_suffix

PATCH_BEGIN = "*** Begin Patch"
PATCH_END = "*** End Patch"
# A leading '$' marks a built-in tool ($web_search), which returns as a builtin_function call.
_HEAD = re.compile(r'\{"name": "(\$?[A-Za-z0-9_-]+)", "arguments": ')

State = Literal["open", "head", "args", "args_end", "patch", "close"]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class CallStreamParser:
    def __init__(self, syntax: CallSyntax, new_id: Callable[[], str] = new_call_id) -> None:
        self.syntax = syntax
        self._new_id = new_id
        self._state: State = "open"
        self._buf = ""
        self.count = 0  # calls whose text ended as the grammar requires; the next call's index
        # JSON scanning state for the arguments object, kept across chunks.
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self.name = ""  # the call being written: its name and its arguments so far
        self.arguments = ""

    @property
    def state(self) -> State:
        return self._state

    @property
    def pending(self) -> str:
        """Text fed but not yet taken into an event (a marker or call head only partly there)."""
        return self._buf

    def feed(self, text: str) -> list[ToolCallDelta]:
        self._buf += text
        out: list[ToolCallDelta] = []
        while self._step(out):
            pass
        return out

    def _literal(self, literal: str) -> bool | None:
        """Consumes ``literal``: True when done, None while only a prefix of it is buffered."""
        if self._buf.startswith(literal):
            self._buf = self._buf[len(literal) :]
            return True
        if literal.startswith(self._buf):
            return None
        return False

    def _step(self, out: list[ToolCallDelta]) -> bool:
        """One transition; False when more text is needed."""
        if not self._buf:
            return False
        s = self._state
        if s == "open":
            if self.count and self._buf[0] == self.syntax.separator:
                self._buf = self._buf[1:]
                return True
            done = self._literal(self.syntax.open)
            if done is None:
                return False
            self._state = "head"
            return True
        if s == "head":
            return self._head(out)
        if s == "args":
            self._args(out)
            return self._state != "args"
        if s == "args_end":
            self._buf = self._buf[1:]  # the call object's closing brace
            self._close_call()
            return True
        if s == "patch":
            return self._patch(out)
        done = self._literal(self.syntax.close)
        if done is None:
            return False
        self._state = "open"
        return True

    def _head(self, out: list[ToolCallDelta]) -> bool:
        match = _HEAD.match(self._buf)
        if match:
            name = match.group(1)
            kind: Literal["function", "builtin_function"] = "builtin_function" if name.startswith("$") else "function"
            out.append(ToolCallDelta(self.count, self._new_id(), name, kind=kind))
            self.name, self.arguments = name, ""
            self._buf = self._buf[match.end() :]
            self._depth, self._in_string, self._escaped = 0, False, False
            self._state = "args"
            return True
        if self._buf.startswith(PATCH_BEGIN):
            out.append(ToolCallDelta(self.count, self._new_id(), "apply_patch", kind="custom"))
            self._state = "patch"
            return True
        return False

    def _args(self, out: list[ToolCallDelta]) -> None:
        for i, ch in enumerate(self._buf):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    out.append(ToolCallDelta(self.count, arguments=self._buf[: i + 1]))
                    self.arguments += self._buf[: i + 1]
                    self._buf = self._buf[i + 1 :]
                    self._state = "args_end"
                    return
        out.append(ToolCallDelta(self.count, arguments=self._buf))
        self.arguments += self._buf
        self._buf = ""

    def _patch(self, out: list[ToolCallDelta]) -> bool:
        end = self._buf.find(PATCH_END)
        if end >= 0:
            cut = end + len(PATCH_END)
            out.append(ToolCallDelta(self.count, arguments=self._buf[:cut], kind="custom"))
            self._buf = self._buf[cut:]
            self._close_call()
            return True
        # Hold back what could be the start of the end marker; stream the rest.
        keep = partial_suffix(self._buf, PATCH_END)
        emit = self._buf[: len(self._buf) - keep]
        if emit:
            out.append(ToolCallDelta(self.count, arguments=emit, kind="custom"))
        self._buf = self._buf[len(emit) :]
        return False

    def _close_call(self) -> None:
        self.count += 1
        self._state = "close"
