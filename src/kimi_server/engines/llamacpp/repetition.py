"""Ends a generation that loops: the same n-gram of tokens over and over at its end.

A small model can fall into repeating itself ("red, red, red, ...", or one sentence again and
again) and would then run to its output cap or the end of the context, holding a slot all the
while. The guard watches each call's stream pieces (llama.cpp streams about one token each) and
stops the call once its tail is the same n-gram of at most ``max_ngram`` tokens repeated at
least ``min_repeats`` times in a row over at least ``min_tokens`` tokens. A looping answer ends
the request with ``finish_reason: "length"``, as if it had hit its cap, and says the guard
stopped it (``Finish.looped``); looping reasoning ends only the reasoning, and the answer
follows (docs/configuration.md).

For every period n it keeps how many pieces in a row have equalled the piece n before them:
the tail is n-periodic over that run plus n pieces. That costs ``max_ngram`` comparisons per
piece and no scan of the history.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RepetitionLimits:
    max_ngram: int = 32  # the longest repeated unit watched, in tokens; 0: the guard is off
    min_repeats: int = 4  # that unit, this many times in a row at the end ...
    min_tokens: int = 96  # ... over at least this many tokens

    @property
    def enabled(self) -> bool:
        return self.max_ngram > 0


class RepetitionGuard:
    def __init__(self, limits: RepetitionLimits) -> None:
        self.limits = limits
        self._recent: deque[str] = deque(maxlen=limits.max_ngram + 1)
        self._runs = [0] * (limits.max_ngram + 1)  # index n: pieces equal to the one n before
        self.looped = False  # it has called a loop

    def looping(self, piece: str) -> bool:
        """Feeds one streamed piece; True once the tail is a loop by the limits."""
        limits = self.limits
        if not limits.enabled:
            return False
        self._recent.append(piece)
        seen = len(self._recent)
        for n in range(1, limits.max_ngram + 1):
            if seen > n and self._recent[-1 - n] == piece:
                self._runs[n] += 1
                span = self._runs[n] + n
                if span >= limits.min_tokens and span >= limits.min_repeats * n:
                    self.looped = True
                    return True
            else:
                self._runs[n] = 0
        return False
