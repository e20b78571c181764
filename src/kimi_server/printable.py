"""Text that others chose (key names, model ids) made safe to print on a terminal or in a log.

Control characters, bidirectional overrides and other invisible format characters are shown
as escapes (``\\x1b``, ``\\u202e``), so a name cannot recolour, move or hide what follows it.
"""

from __future__ import annotations

import unicodedata

_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def visible(text: str) -> str:
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _INVISIBLE else ch for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
