"""Search providers on real parts: the SQLite FTS5 index through the ``kimi-server search`` CLI,
and the SearXNG provider against a fake SearXNG speaking its JSON API on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import parse_qs, urlparse

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.search.base import SearchHit
from kimi_server.search.local_index import LocalIndex
from kimi_server.search.searcher import Searcher, as_tool_text, fit_budget
from kimi_server.search.searxng import SearxngProvider


class FakeSearxng(BaseHTTPRequestHandler):
    mode = "ok"
    seen: ClassVar[list[dict[str, list[str]]]] = []

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        FakeSearxng.seen.append(query)
        if self.mode == "slow":
            time.sleep(3)
        if url.path != "/search" or query.get("format") != ["json"] or self.mode == "error":
            self.send_response(403)
            self.end_headers()
            return
        if self.mode == "garbage":
            body = b"<html>not json</html>"
        else:
            results = [
                {"url": f"https://example.org/{n}", "title": f"Result {n}", "content": f"About {query['q'][0]} {n}"}
                for n in range(8)
            ]
            results.insert(1, {"url": "javascript:alert(1)", "title": "bad", "content": "x"})
            body = json.dumps({"query": query["q"][0], "results": results}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the slow case: the client gave up
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def searxng() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSearxng)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeSearxng.mode, FakeSearxng.seen = "ok", []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_searxng_results(searxng: str) -> None:
    searcher = Searcher(SearxngProvider(searxng, timeout_s=5), max_results=3, token_budget=1000)
    run = asyncio.run(searcher.run("  kimi   homepage "))
    assert run.fresh and run.outcome.error is None
    assert [h.url for h in run.outcome.hits] == [f"https://example.org/{n}" for n in range(3)]
    assert FakeSearxng.seen[-1]["q"] == ["kimi homepage"]
    assert "[1] Result 0" in as_tool_text(run.outcome)
    again = asyncio.run(searcher.run("kimi homepage"))
    assert not again.fresh and len(FakeSearxng.seen) == 1 and searcher.calls == 1


@pytest.mark.parametrize(
    ("mode", "message"),
    [("error", "HTTP 403"), ("garbage", "not JSON"), ("slow", "in time")],
)
def test_searxng_failures_become_readable_results(searxng: str, mode: str, message: str) -> None:
    FakeSearxng.mode = mode
    searcher = Searcher(SearxngProvider(searxng, timeout_s=1), max_results=3, token_budget=1000)
    run = asyncio.run(searcher.run("anything"))
    assert run.outcome.error and message in run.outcome.error and not run.outcome.hits
    assert "failed" in as_tool_text(run.outcome)


def test_budget_keeps_title_and_url() -> None:
    hits = tuple(SearchHit(f"T{n}", f"https://e.org/{n}", "word " * 200) for n in range(5))
    kept = fit_budget(hits, 100)
    assert kept and len(kept) < 5
    assert sum(len(h.title) + len(h.url) + len(h.snippet) + 16 for h in kept) <= 400
    assert all(h.url.startswith("https://e.org/") for h in kept)


def test_cli_index_list_remove_and_live_search(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Quokka facts\n\nQuokkas live on Rottnest Island.\n")
    (docs / "b.txt").write_text("Wombats dig burrows.\n")
    (docs / "skip.bin").write_bytes(b"\0\1")
    index = tmp_path / "i.sqlite3"
    idx = LocalIndex(index)
    runner = CliRunner()
    r = runner.invoke(app, ["search", "index", str(docs), "--index", str(index)])
    assert r.exit_code == 0, r.output
    assert "2 document(s) indexed" in r.output
    hit = idx.query("where do quokkas live", 5).hits
    assert hit and hit[0].title == "Quokka facts" and "Rottnest" in hit[0].snippet
    r = runner.invoke(app, ["search", "list", "--index", str(index)])
    assert "a.md" in r.output and "b.txt" in r.output
    # Indexing again replaces, never duplicates; a reader already open sees the change.
    (docs / "b.txt").write_text("Wombats have cube-shaped droppings.\n")
    runner.invoke(app, ["search", "index", str(docs / "b.txt"), "--index", str(index)])
    assert len(idx.documents()) == 2 and "cube" in idx.query("wombats", 5).hits[0].snippet
    r = runner.invoke(app, ["search", "remove", str(docs / "a.md"), "--index", str(index)])
    assert r.exit_code == 0 and "1 document(s) removed" in r.output
    assert not idx.query("quokkas", 5).hits
    r = runner.invoke(app, ["search", "index", str(tmp_path / "missing.md"), "--index", str(index)])
    assert r.exit_code == 1 and "no such file" in " ".join(r.output.split())


def test_sources_are_named_by_id_or_operator_url_never_by_path(tmp_path: Path) -> None:
    docs = tmp_path / "secret-dir"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "a b.md").write_text("# Quokka facts\n\nQuokkas live on Rottnest Island.\n")
    (docs / "w.txt").write_text("Wombats dig burrows.\n")
    index = tmp_path / "i.sqlite3"
    idx = LocalIndex(index)
    runner = CliRunner()
    assert runner.invoke(app, ["search", "index", str(docs), "--index", str(index)]).exit_code == 0
    hit = idx.query("quokkas", 5).hits[0]
    assert hit.url.startswith("doc:") and "secret-dir" not in hit.url
    assert "secret-dir" not in as_tool_text(idx.query("quokkas wombats", 5))
    # Re-indexing keeps the name; the operator's list shows where each one comes from.
    runner.invoke(app, ["search", "index", str(docs / "sub"), "--index", str(index)])
    assert idx.query("quokkas", 5).hits[0].url == hit.url and len(idx.documents()) == 2
    listing = runner.invoke(app, ["search", "list", "--index", str(index)]).output
    assert hit.url in listing and "a b.md" in listing
    # An operator-set URL replaces the id: a directory's files below its base.
    r = runner.invoke(app, ["search", "index", str(docs), "--url", "https://kb.example.org/x/", "--index", str(index)])
    assert r.exit_code == 0, r.output
    urls = {h.url for h in idx.query("quokkas wombats", 5).hits}
    assert urls == {"https://kb.example.org/x/sub/a%20b.md", "https://kb.example.org/x/w.txt"}
    assert len(idx.documents()) == 2
    r = runner.invoke(
        app, ["search", "index", str(docs / "w.txt"), "--url", "https://kb.example.org/w", "--index", str(index)]
    )
    assert r.exit_code == 0 and idx.query("wombats", 5).hits[0].url == "https://kb.example.org/w"
    for bad in (["--url", "file:///etc/x"], ["--url", "https://kb.example.org/no-slash"]):
        r = runner.invoke(app, ["search", "index", str(docs), *bad, "--index", str(index)])
        assert r.exit_code == 1 and "--url" in r.output
    r = runner.invoke(app, ["search", "remove", "https://kb.example.org/w", "--index", str(index)])
    assert "1 document(s) removed" in r.output and not idx.query("wombats", 5).hits


def test_an_older_index_of_file_urls_shows_no_path(tmp_path: Path) -> None:
    """An index written before sources were named holds file:// URLs: never shown, and named
    with document ids the first time the index is written again."""
    index = tmp_path / "old.sqlite3"
    with sqlite3.connect(index) as conn:
        conn.execute("CREATE VIRTUAL TABLE docs USING fts5(url UNINDEXED, title, body, tokenize = 'porter unicode61')")
        url = (tmp_path / "hidden" / "q.md").as_uri()
        conn.execute("INSERT INTO docs VALUES (?, 'Quokkas', 'Quokkas live on Rottnest Island.')", (url,))
    idx = LocalIndex(index)
    shown = idx.query("quokkas", 5).hits[0].url
    assert shown.startswith("doc:") and "hidden" not in shown
    (tmp_path / "other.md").write_text("Wombats.\n")
    idx.add([tmp_path / "other.md"])
    named = {d.url: d.path for d in idx.documents()}
    assert str(tmp_path / "hidden" / "q.md") in named.values() and all(u.startswith("doc:") for u in named)
    assert idx.remove(str(tmp_path / "hidden")) == 1 and not idx.query("quokkas", 5).hits


def test_query_syntax_is_not_fts_syntax(tmp_path: Path) -> None:
    idx = LocalIndex(tmp_path / "i.sqlite3")
    (tmp_path / "d.md").write_text("Alpha beta gamma.\n")
    idx.add([tmp_path / "d.md"])
    for query in ['alpha" OR body:*', "NEAR(alpha", "beta)) --", "*"]:
        outcome = idx.query(query, 5)  # never an FTS5 syntax error
        assert outcome.error is None
