"""How much of a streamed text to hold back: a tag or phrase may arrive split across pieces."""

from __future__ import annotations


def partial_suffix(text: str, *tags: str) -> int:
    """Length of the longest suffix of ``text`` that could still grow into one of ``tags`` (a
    proper prefix of it); 0 when none could, and the whole text may be let through."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best
