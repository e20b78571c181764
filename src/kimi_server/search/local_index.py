"""The embedded provider: a SQLite FTS5 index over documents the operator loads.

One file (``<data_dir>/search-index.sqlite3`` by default). ``kimi-server search index`` writes
it; a running server opens it read-only per query, so what was just indexed is searchable at
once without a restart.

A source is named, to every tenant, by what the operator chose: a URL given when indexing
(``--url``), else a random document id (``doc:…``) kept across re-indexing. The file's path on
the server stays in the ``sources`` table, for the operator's ``list`` and ``remove`` only.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import re
import secrets
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlsplit
from urllib.request import url2pathname

from kimi_server.search.base import SearchFailed, SearchHit, SearchOutcome

TEXT_SUFFIXES = frozenset({".txt", ".text", ".md", ".markdown", ".rst"})
HTML_SUFFIXES = frozenset({".html", ".htm"})
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
DOC_ID_PREFIX = "doc:"
_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS docs USING fts5(
    url UNINDEXED, title, body, tokenize = 'porter unicode61'
);
CREATE TABLE IF NOT EXISTS sources (url TEXT PRIMARY KEY, path TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sources_by_path ON sources (path);
"""
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class IndexedDocument:
    url: str  # what tenants see: the operator's URL or a document id
    title: str
    chars: int
    path: str = ""  # the file on this server (operators only)


def new_document_id() -> str:
    return DOC_ID_PREFIX + secrets.token_hex(8)


def public_name(url: str) -> str:
    """A stored URL as a tenant may see it. An index written before sources were named holds
    ``file://`` URLs of server paths: those show as an id derived from them, never the path."""
    if url.startswith("file:"):
        return DOC_ID_PREFIX + hashlib.sha256(url.encode()).hexdigest()[:16]
    return url


def _path_of_file_url(url: str) -> str:
    return str(Path(url2pathname(urlsplit(url).path)))


def _checked_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url must be an http(s) URL, got {url!r}")
    return url


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
            _name_legacy_sources(conn)
            return conn
        return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)

    def add(self, paths: Iterable[Path], *, url: str | None = None) -> list[IndexedDocument]:
        """Indexes files (directories recursively); a file indexed again replaces itself and
        keeps its name. ``url``: the URL tenants see, for one file; ending in ``/``, the base
        that each file's path below the directory given (or its name) is appended to."""
        found = _files(list(paths), url)
        done: list[IndexedDocument] = []
        with self._connect(write=True) as conn:
            for file, public in found:
                title, text = read_document(file)
                path = str(file.resolve())
                name = public or _kept_id(conn, path) or new_document_id()
                _forget(conn, path, name)
                conn.execute("INSERT INTO docs (url, title, body) VALUES (?, ?, ?)", (name, title, text))
                conn.execute("INSERT INTO sources (url, path) VALUES (?, ?)", (name, path))
                done.append(IndexedDocument(name, title, len(text), path))
        return done

    def documents(self) -> list[IndexedDocument]:
        if not self.path.exists():
            return []
        with self._connect(write=False) as conn:
            rows = conn.execute(
                "SELECT d.url, d.title, length(d.body), s.path FROM docs d "
                "LEFT JOIN sources s ON s.url = d.url ORDER BY d.url"
            ).fetchall()
        return [
            IndexedDocument(u, t, n, p or (_path_of_file_url(u) if u.startswith("file:") else ""))
            for u, t, n, p in rows
        ]

    def remove(self, target: str) -> int:
        """Removes documents by name (a document id or URL), or by a path (a directory removes
        everything under it)."""
        if not self.path.exists():
            return 0
        with self._connect(write=True) as conn:
            names = {r[0] for r in conn.execute("SELECT url FROM sources WHERE url = ?", (target,))}
            if not names:
                path = _path_of_file_url(target) if target.startswith("file:") else str(Path(target).resolve())
                names = {
                    r[0]
                    for r in conn.execute(
                        "SELECT url FROM sources WHERE path = ? OR path LIKE ? ESCAPE '\\'",
                        (path, _like_prefix(path.rstrip("/") + "/")),
                    )
                }
            for name in names:
                conn.execute("DELETE FROM docs WHERE url = ?", (name,))
                conn.execute("DELETE FROM sources WHERE url = ?", (name,))
            return len(names)

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
        hits = tuple(SearchHit(html.unescape(t), public_name(u), " ".join(s.split())) for u, t, s in rows)
        return SearchOutcome(query, hits)

    async def search(self, query: str, limit: int) -> SearchOutcome:
        return await asyncio.to_thread(self.query, query, limit)


def _files(paths: list[Path], url: str | None) -> list[tuple[Path, str | None]]:
    """Each file to index with the URL the operator gave it (None: it gets a document id)."""
    if url is not None:
        _checked_url(url)
    out: list[tuple[Path, str | None]] = []
    for p in paths:
        if p.is_dir():
            if url is not None and not url.endswith("/"):
                raise ValueError(f"--url for a directory ({p}) must end with '/': each file's path is appended")
            for f in sorted(p.rglob("*")):
                if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES | HTML_SUFFIXES:
                    out.append((f, _joined(url, f.relative_to(p).as_posix())))
        elif p.is_file():
            if url is not None and not url.endswith("/") and len(paths) > 1:
                raise ValueError("--url without a trailing '/' names one file: index the files one at a time")
            out.append((p, url if url is None or not url.endswith("/") else _joined(url, p.name)))
        else:
            raise ValueError(f"{p}: no such file or directory")
    return out


def _joined(base: str | None, relative: str) -> str | None:
    return None if base is None else base + quote(relative)


def _kept_id(conn: sqlite3.Connection, path: str) -> str | None:
    """The document id this file already has, so that re-indexing keeps its name."""
    row = conn.execute("SELECT url FROM sources WHERE path = ? AND url LIKE 'doc:%'", (path,)).fetchone()
    return str(row[0]) if row else None


def _forget(conn: sqlite3.Connection, path: str, name: str) -> None:
    """Drops the earlier copy of this file and any other document under the same name."""
    names = {r[0] for r in conn.execute("SELECT url FROM sources WHERE path = ? OR url = ?", (path, name))}
    for old in names | {name}:
        conn.execute("DELETE FROM docs WHERE url = ?", (old,))
        conn.execute("DELETE FROM sources WHERE url = ?", (old,))


def _name_legacy_sources(conn: sqlite3.Connection) -> None:
    """Gives every document an older version stored under its ``file://`` URL a document id."""
    rows = conn.execute("SELECT rowid, url FROM docs WHERE url LIKE 'file:%'").fetchall()
    for rowid, url in rows:
        name = new_document_id()
        conn.execute("UPDATE docs SET url = ? WHERE rowid = ?", (name, rowid))
        conn.execute("INSERT OR REPLACE INTO sources (url, path) VALUES (?, ?)", (name, _path_of_file_url(url)))


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"
