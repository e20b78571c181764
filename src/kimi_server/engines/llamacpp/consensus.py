"""Which of several independent attempts the answer should build on.

A small model sampled more than once is right more often in the majority than in any one
sample; its wrong samples disagree with each other, its right ones agree. So the attempt chosen
is the one that shares the most with the others (the medoid under word overlap, as in
minimum-Bayes-risk decoding), judged on each attempt's conclusion: its last line of text, where
it states its result. Judged on whole attempts, those written in one style (a code listing and
its made-up output) agreed by their boilerplate and won while their numbers were wrong.
Degenerate samples (a repeated digit, a derailed derivation) overlap with nothing and lose.
"""

from __future__ import annotations

import re

# A "word" this long is a degenerate sample (a digit repeated for a line), never a conclusion.
DEGENERATE_CHARS = 40
# Numbers whole ("2.5" is not "2" and "5"), then words; case does not matter.
_TOKEN = re.compile(r"\d+(?:\.\d+)?|\w+")
_TEXT = re.compile(r"[^\W_]")


def conclusion(text: str) -> str:
    """The last line that says something: not blank, not punctuation, not a code fence."""
    for line in reversed(text.splitlines()):
        if _TEXT.search(line) and not line.lstrip().startswith("```"):
            return line
    return text


def _conclusion_words(text: str) -> frozenset[str]:
    words = frozenset(_TOKEN.findall(conclusion(text).lower()))
    return frozenset() if any(len(w) > DEGENERATE_CHARS for w in words) else words


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def most_agreed(attempts: list[str]) -> int:
    """Index of the attempt closest to all the others."""
    if len(attempts) < 2:
        return 0
    words = [_conclusion_words(a) for a in attempts]
    scores = [sum(_overlap(words[i], words[j]) for j in range(len(words)) if j != i) for i in range(len(words))]
    # On a tie an attempt with a conclusion beats one without (a degenerate one), then the earliest.
    return max(range(len(scores)), key=lambda i: (scores[i], bool(words[i]), -i))
