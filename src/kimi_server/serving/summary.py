"""The reasoning summary of a Responses reasoning item.

The model does not write a separate summary, so the summary is extractive: the reasoning's
leading sentences, cut at the last sentence end within a length bound (``reasoning.summary``
picks the bound). Without a sentence end in reach it is cut at a word and marked with an
ellipsis. Text is released as soon as it is certain to belong to the summary, so a stream shows
it while the model is still reasoning.
"""

from __future__ import annotations

import re

# A full stop, question or exclamation mark followed by whitespace, or a CJK one.
SENTENCE_END = re.compile(r"[.!?](?=\s)|[\u3002\uff01\uff1f]")
ELLIPSIS = "…"


class Summarizer:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.text = ""
        self.summary = ""
        self._start: int | None = None  # where the reasoning's first non-space character is
        self._released = 0  # characters of text[start:] already in the summary

    def feed(self, delta: str) -> str:
        """Adds reasoning text; returns summary text that became certain."""
        self.text += delta
        if self._start is None:
            stripped = len(self.text) - len(self.text.lstrip())
            if stripped == len(self.text):
                return ""
            self._start = stripped
        window = self.text[self._start : self._start + self.limit]
        ends = [m.end() for m in SENTENCE_END.finditer(window)]
        if not ends or ends[-1] <= self._released:
            return ""
        return self._release(window[self._released : ends[-1]])

    def finish(self) -> str:
        """Ends the reasoning; returns the rest of the summary."""
        if self._start is None:
            return ""
        body = self.text[self._start :].rstrip()
        if len(body) <= self.limit:
            return self._release(body[self._released :])
        if self._released:
            return ""
        cut = body[: self.limit]
        space = cut.rfind(" ")
        if space > self.limit // 2:
            cut = cut[:space]
        return self._release(cut.rstrip() + ELLIPSIS)

    def _release(self, piece: str) -> str:
        self._released += len(piece)
        self.summary += piece
        return piece
