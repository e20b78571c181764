"""Reasoning formats: how a model's thinking is produced and told apart from its answer.

- ``prompted``: for models with no thinking mode of their own. The reasoning is a series of
  independent attempts at the reply, as many as the effort's floor asks for; the one the
  others agree with most is the answer, or under a grammar the draft of an answer generated in
  a turn of its own (``engines/llamacpp/reasoning_step.py``, ``consensus.py``). The tags only keep an
  answer clean.
- ``think-tags``: for models that think natively between ``<think>`` and ``</think>`` (Qwen3,
  DeepSeek-R1 style). One generation; the stream is split at the tags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from kimi_server.parsers.partial import partial_suffix


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    kind: Literal["prompted", "native"]
    opener: str
    closer: str
    # Given to a model with no thinking mode of its own once its attempts are made, where the
    # answer is decoded under a grammar: the chosen attempt ({draft}) in a system turn after
    # the conversation, so that the reply is a fresh answer to the user. Measured on the
    # default model: text after the attempt in the same turn commented on it ("This
    # answer is designed to..."); the attempt as the assistant's turn followed by a user or
    # system request for a final reply drew refusals ("I'm sorry, but I can't assist with
    # that"); a draft in a system turn is copied where it is right.
    follow_up: str = ""

    @property
    def stop_marker(self) -> str:
        """The closing tag the model may emit itself, without surrounding whitespace."""
        return self.closer.strip()

    @property
    def stops(self) -> tuple[str, ...]:
        """Tags that open or close a reasoning block, or a tool result the template wraps: an
        answer (or an attempt) ends at them, and cannot begin with them. A small
        model answering right after a tool result was seen to copy the result's wrapper and
        the result itself instead of answering."""
        return tuple(dict.fromkeys((self.opener.strip(), self.stop_marker, *THINK_TAGS, *TOOL_RESULT_TAGS)))

    @property
    def scaffold(self) -> tuple[str, ...]:
        """The follow-up's own sentences, around the draft: never part of an answer."""
        return tuple(
            line.strip() for part in self.follow_up.split("{draft}") for line in part.splitlines() if line.strip()
        )

    @property
    def markers(self) -> tuple[str, ...]:
        """All text of the reasoning machinery, none of which belongs in an answer: the think
        tags, and the wrapper tags small models put around an answer after thinking."""
        return (*self.stops, *WRAPPER_TAGS)


THINK_TAGS = ("<think>", "</think>")
TOOL_RESULT_TAGS = ("<tool_response>", "</tool_response>")
WRAPPER_TAGS = tuple(
    tag
    for name in ("answer", "final_answer", "final", "reply", "response", "result")
    for tag in (f"<{name}>", f"</{name}>")
)


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "prompted": ReasoningFormat(
        "prompted",
        "prompted",
        "<think>\n",
        "\n</think>\n\n",
        follow_up=(
            "A draft of your reply to the user's latest message:\n\n{draft}\n\n"
            "Reply to the user now, using the draft where it is right."
        ),
    ),
    "think-tags": ReasoningFormat("think-tags", "native", "<think>", "</think>"),
}


def get_reasoning_format(name: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_FORMATS))
        raise ValueError(f"unknown reasoning format {name!r}; known: {known}") from None


class ThinkTagSplitter:
    """Splits a streamed generation into (reasoning, content) at the think tags.

    Text before ``opener`` that is only whitespace is dropped; a tag split across chunks is held
    back until it can be decided. If the model never opens a block, everything is content.
    """

    def __init__(self, fmt: ReasoningFormat, *, opened: bool = False) -> None:
        self._open, self._close = fmt.opener, fmt.closer
        self._state: Literal["start", "thinking", "closed", "answer"] = "thinking" if opened else "start"
        self._buf = ""

    def feed(self, text: str) -> list[tuple[Literal["reasoning", "content"], str]]:
        self._buf += text
        out: list[tuple[Literal["reasoning", "content"], str]] = []
        while self._buf:
            if self._state == "start":
                if not self._leave_start():
                    return out
            elif self._state == "thinking":
                if not self._take_reasoning(out):
                    return out
            elif self._state == "closed":
                # The blank line after the closing tag belongs to neither part.
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = "answer"
            else:
                out.append(("content", self._buf))
                self._buf = ""
        return out

    def _leave_start(self) -> bool:
        """Decides from the buffer's start whether a reasoning block opens; False while the
        text so far cannot tell."""
        stripped = self._buf.lstrip()
        if not stripped:
            return False
        if stripped.startswith(self._open):
            self._buf = stripped[len(self._open) :]
            self._state = "thinking"
        elif self._open.startswith(stripped):
            return False  # could still become the opening tag
        else:
            self._state = "answer"
        return True

    def _take_reasoning(self, out: list[tuple[Literal["reasoning", "content"], str]]) -> bool:
        """Moves reasoning from the buffer to ``out``, up to the closing tag; True when the tag
        was found (and consumed), False when the rest (less a partial tag) was all reasoning."""
        idx = self._buf.find(self._close)
        if idx >= 0:
            if idx:
                out.append(("reasoning", self._buf[:idx]))
            self._buf = self._buf[idx + len(self._close) :]
            self._state = "closed"
            return True
        keep = partial_suffix(self._buf, self._close)
        emit = self._buf[: len(self._buf) - keep]
        if emit:
            out.append(("reasoning", emit))
        self._buf = self._buf[len(emit) :]
        return False

    def flush(self) -> list[tuple[Literal["reasoning", "content"], str]]:
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        if self._state == "closed":
            rest = rest.lstrip()
        return [("reasoning" if self._state == "thinking" else "content", rest)] if rest else []


class MarkerScrub:
    """Removes marker text from a streamed answer: the given markers, also spelled with spaces
    or in capitals (``< think>``, ``</Answer >``). A marker split across chunks is held back
    until it is decided."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        names = sorted({m.strip("</>") for m in markers}, key=len, reverse=True)
        alternatives = "|".join(re.escape(n) for n in names)
        self._full = re.compile(rf"<\s*/?\s*(?:{alternatives})\s*>", re.IGNORECASE)
        # What may still grow into a marker: "<", "< /", "</thi", "</think " ...
        self._partial = re.compile(r"<\s*/?\s*[A-Za-z_]*\s*$")
        self._buf = ""

    def feed(self, text: str) -> str:
        self._buf += text
        # Removing one marker may join the text around it into another.
        while (cleaned := self._full.sub("", self._buf)) != self._buf:
            self._buf = cleaned
        held = self._partial.search(self._buf[-24:])
        keep = len(held.group()) if held is not None else 0
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out

    def flush(self) -> str:
        rest, self._buf = self._buf, ""
        return rest


class PhraseScrub:
    """Removes given phrases from a streamed answer: the server's own words to the model, which
    a small model sometimes copies into its reply ("A draft of your reply ..."). Text that may
    still grow into a phrase is held back until it is decided."""

    def __init__(self, phrases: tuple[str, ...]) -> None:
        self._phrases = tuple(p for p in phrases if p)
        self._buf = ""

    def feed(self, text: str) -> str:
        self._buf += text
        for phrase in self._phrases:
            self._buf = self._buf.replace(phrase, "")
        if not self._phrases:
            out, self._buf = self._buf, ""
            return out
        keep = partial_suffix(self._buf, *self._phrases)
        # Whitespace is held too: what a removed phrase leaves at the end is dropped.
        body = self._buf[: len(self._buf) - keep]
        keep += len(body) - len(body.rstrip())
        out, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
        return out

    def flush(self) -> str:
        rest, self._buf = self._buf, ""
        return rest.rstrip() if self._phrases else rest
