"""The embedded provider: a SQLite FTS5 index over documents the operator loads.

One file (``<data_dir>/search-index.sqlite3`` by default). ``kimi-server search index`` writes
it; a running server opens it read-only per query, so what was just indexed is searchable at
once without a restart.
"""

from __future__ import annotations

import asyncio
import html
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from kimi_server.search.base import SearchFailed, SearchHit, SearchOutcome

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md", ".markdown", ".rst"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5(
    url UNINDEXED, title, body, tokenize = 'porter unicode61'
);
"""
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class IndexedDocument:
    url: str
    title: str
    chars: int


class _TextOfHTML(HTMLParser):
    """Visible text and the <title> of an HTML page (scripts and styles skipped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "noscript"):
            self._skip += 1
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "noscript") and self._skip:
            self._skip -= 1
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.parts.append(data)


def read_document(path: Path) -> tuple[str, str]:
    """(title, text) of a text, Markdown or HTML file."""
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES | HTML_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix or '(none)'} (text, Markdown, HTML)")
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{path}: larger than {MAX_DOCUMENT_BYTES} bytes")
    raw = path.read_text(encoding="utf-8", errors="replace")
    if suffix in HTML_SUFFIXES:
        parser = _TextOfHTML()
        parser.feed(raw)
        text = " ".join(" ".join(parser.parts).split())
        return (" ".join(parser.title.split()) or path.stem, text)
    title = path.stem
    for line in raw.splitlines():
        if line.strip():
            title = line.strip().lstrip("#").strip() or title
            break
    return title, raw.strip()


def _fts_query(query: str) -> str:
    """Words of the query, each quoted, OR-ed: user text never reaches FTS5's query syntax."""
    words = _WORD.findall(query.lower())[:32]
    return " OR ".join(f'"{w}"' for w in words)


class LocalIndex:
    name = "local"

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self, *, write: bool) -> sqlite3.Connection:
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path)
            conn.executescript(_SCHEMA)
            return conn
        return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)

    def add(self, paths: Iterable[Path]) -> list[IndexedDocument]:
        """Indexes files (directories recursively); a file indexed again replaces itself."""
        files: list[Path] = []
        for p in paths:
            if p.is_dir():
                files.extend(
                    f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES | HTML_SUFFIXES
                )
            elif p.is_file():
                files.append(p)
            else:
                raise ValueError(f"{p}: no such file or directory")
        done: list[IndexedDocument] = []
        with self._connect(write=True) as conn:
            for f in files:
                title, text = read_document(f)
                url = f.resolve().as_uri()
                conn.execute("DELETE FROM docs WHERE url = ?", (url,))
                conn.execute("INSERT INTO docs (url, title, body) VALUES (?, ?, ?)", (url, title, text))
                done.append(IndexedDocument(url, title, len(text)))
        return done

    def documents(self) -> list[IndexedDocument]:
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            rows = conn.execute("SELECT url, title, length(body) FROM docs ORDER BY url").fetchall()
        return [IndexedDocument(u, t, n) for u, t, n in rows]

    def remove(self, target: str) -> int:
        """Removes documents by URL, or by a path (a directory removes everything under it)."""
        if not self.path.exists():
            return 0
        url = target if target.startswith("file:") else Path(target).resolve().as_uri()
        with self._connect(write=True) as conn:
            cur = conn.execute(
                "DELETE FROM docs WHERE url = ? OR url LIKE ? ESCAPE '\\'",
                (url, _like_prefix(url.rstrip("/") + "/")),
            )
            return cur.rowcount

    def query(self, query: str, limit: int) -> SearchOutcome:
        match = _fts_query(query)
        if not match:
            return SearchOutcome(query)
        if not self.path.exists():
            raise SearchFailed("the local search index is empty")
        try:
            with self._connect(write=False) as conn:
                rows = conn.execute(
                    "SELECT url, title, snippet(docs, 2, '', '', ' … ', 48) FROM docs "
                    "WHERE docs MATCH ? ORDER BY bm25(docs, 0.0, 4.0, 1.0) LIMIT ?",
                    (match, limit),
                ).fetchall()
        except sqlite3.Error as exc:
            raise SearchFailed(f"the local search index could not be read ({type(exc).__name__})") from None
        hits = tuple(SearchHit(html.unescape(t), u, " ".join(s.split())) for u, t, s in rows)
        return SearchOutcome(query, hits)

    async def search(self, query: str, limit: int) -> SearchOutcome:
        return await asyncio.to_thread(self.query, query, limit)


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"
