"""Scrubbing an upstream's error text before it reaches a client or the log.

An upstream's message may name where it lives: a URL (its own, a model store's, a proxy's),
a host or an address, a file or URL path. None of that is the client's business, and the log
is read by more people than the upstream's configuration is. Any URL, any IP address, any
configured upstream host and any absolute path is replaced by a placeholder; the rest of the
message (what was wrong with the request) stays. Control, bidirectional and other invisible
characters are shown as escapes (``\\x1b``, ``\\u202e``): the text is the upstream's choice, and
a client's terminal or a log viewer must not be recoloured or reordered by it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from kimi_server.printable import visible

MAX_CHARS = 300

_URL = re.compile(r"\b[a-z][a-z0-9+.-]{1,15}://[^\s\"'<>`]+", re.IGNORECASE)
_IPV6 = re.compile(r"\[[0-9a-f.%]*:[\w:.%]*\](?::\d+)?", re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])")
# An absolute path: a slash at the start of a word (not inside "a/b" or "4096/2"), then segments.
_PATH = re.compile(r"(?<![\w/.~-])(?:~|\.{1,2})?/[\w.~%+@-]+(?:/[\w.~%+@=-]*)*")

# Hosts of every configured upstream: an error from one may name another (a router, a mirror).
_hosts: set[str] = set()


def register_upstream(base_url: str) -> None:
    parts = urlsplit(base_url)
    for host in (parts.netloc, parts.hostname):
        if host and len(host) > 2:
            _hosts.add(host.lower())


def scrub(text: str, extra_hosts: Iterable[str] = ()) -> str:
    """``text`` without URLs, addresses, configured hosts or absolute paths, invisible characters
    escaped, at most 300 characters."""
    text = _URL.sub("<url>", text)
    # Longest first, so "host:8000" goes whole before "host" would leave ":8000" behind.
    for host in sorted({*_hosts, *(h.lower() for h in extra_hosts)}, key=len, reverse=True):
        text = re.sub(re.escape(host), "<upstream>", text, flags=re.IGNORECASE)
    text = _IPV6.sub("<address>", text)
    text = _IPV4.sub("<address>", text)
    text = _PATH.sub("<path>", text)
    return _bounded(text)


def _bounded(text: str) -> str:
    """At most ``MAX_CHARS`` once escaped, never ending inside an escape."""
    if text.isprintable():  # the common case: nothing to escape
        return text[:MAX_CHARS]
    out: list[str] = []
    size = 0
    for ch in text:
        piece = visible(ch)
        size += len(piece)
        if size > MAX_CHARS:
            break
        out.append(piece)
    return "".join(out)
