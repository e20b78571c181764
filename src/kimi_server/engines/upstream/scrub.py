"""Scrubbing an upstream's error text before it reaches a client or the log.

An upstream's message may name where it lives: a URL (its own, a model store's, a proxy's),
a host or an address, a file or URL path. None of that is the client's business, and the log
is read by more people than the upstream's configuration is. Any URL, any IP address, any
configured upstream host and any absolute path is replaced by a placeholder; the rest of the
message (what was wrong with the request) stays.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

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
    """``text`` without URLs, addresses, configured hosts or absolute paths, at most 300 characters."""
    text = _URL.sub("<url>", text)
    # Longest first, so "host:8000" goes whole before "host" would leave ":8000" behind.
    for host in sorted({*_hosts, *(h.lower() for h in extra_hosts)}, key=len, reverse=True):
        text = re.sub(re.escape(host), "<upstream>", text, flags=re.IGNORECASE)
    text = _IPV6.sub("<address>", text)
    text = _IPV4.sub("<address>", text)
    text = _PATH.sub("<path>", text)
    return text[:MAX_CHARS]
