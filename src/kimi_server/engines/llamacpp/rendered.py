"""Prompts the engine rendered while admission counted them, kept for the generation that
follows, so one request renders its chat template and tokenizes its prompt once.

Admission asks the engine for a request's prompt tokens (``count_prompt_tokens``), then hands
the same request object to ``generate``. Rendering a long conversation through a Jinja template
and tokenizing it are the costliest steps before the first llama.cpp call; doing each twice was
pure waste. Entries are keyed by the request object's identity (checked with ``is``, so a
recycled ``id`` never matches) and bounded: a count that is never followed by a generation
(a token-count endpoint, a request refused after counting) is dropped as newer ones arrive.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kimi_server.engines.types import GenerationRequest


@dataclass(frozen=True)
class Rendered:
    prompt: str  # the conversation through the chat template, media markers in place
    tokens: int  # its prompt tokens as counted for admission


class RenderedPrompts:
    def __init__(self, capacity: int = 64) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[int, tuple[GenerationRequest, Rendered]] = OrderedDict()

    def keep(self, request: GenerationRequest, rendered: Rendered) -> None:
        self._entries[id(request)] = (request, rendered)
        self._entries.move_to_end(id(request))
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def take(self, request: GenerationRequest) -> Rendered | None:
        """The prompt counted for this very request object, once; None when it was not counted."""
        entry = self._entries.pop(id(request), None)
        if entry is None or entry[0] is not request:
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)
