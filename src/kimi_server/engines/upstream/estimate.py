"""A generous token count without the model's tokenizer: the last resort for billing an
upstream that reports no usage and offers no tokenize endpoint.

A characters-per-token ratio is wrong exactly where it matters: ``"a\nb\n" * 1000`` is one
token per character, not one per four. So the text is pre-split the way byte-level BPE
tokenizers split it (a word with its leading space, single digits, punctuation runs, each line
break, runs of spaces) and each piece is charged what it costs at most in the large
vocabularies (100k+ tokens: Kimi, Qwen, Llama 3) this server fronts: a token per 6 ASCII
letters, per digit, per 2 punctuation marks, per 2 other letters (accents, Cyrillic), per CJK
character, two per emoji. Against Qwen 2.5's tokenizer it gave 1.0-1.4x the real count on
prose, code, JSON, digits and degenerate multi-line text, 1.5x on CR/LF and 1.8x on Chinese.
Small vocabularies (SmolLM2's 49k) can need more (0.6x on Chinese). It is never the model's
count, and the ledger says so (``server_estimate``).
"""

from __future__ import annotations

import math

import regex

# Per message: the role markers and separators chat templates add (ChatML spends 4-5).
MESSAGE_FRAMING = 5
# The assistant header that opens the reply.
REPLY_FRAMING = 3
ASCII_LETTERS_PER_TOKEN = 6
ASCII_MARKS_PER_TOKEN = 2

# Pre-split as byte-level BPE tokenizers do: a single leading space joins the piece after it.
_PIECES = regex.compile(r" ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\r|\n|[^\S\r\n]+")
_DENSE = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")


def _piece_tokens(piece: str) -> int:
    if piece in ("\n", "\r"):
        return 1
    if piece.isspace():
        return math.ceil(len(piece) / 4)
    body = piece[1:] if piece[0] == " " and len(piece) > 1 else piece
    if body[0].isdigit():
        return 1
    ascii_chars = sum(1 for ch in body if ch < "\x80")
    wide = sum(1 for ch in body if ch > "\uffff")
    dense = len(_DENSE.findall(body))
    other = len(body) - ascii_chars - wide - dense
    per_ascii = ASCII_LETTERS_PER_TOKEN if body[0].isalpha() else ASCII_MARKS_PER_TOKEN
    return max(1, math.ceil(ascii_chars / per_ascii) + math.ceil(other / 2) + dense + 2 * wide)


def estimate_tokens(text: str) -> int:
    """At least the tokens ``text`` takes in common large vocabularies, usually a little more."""
    return sum(_piece_tokens(m.group()) for m in _PIECES.finditer(text))
