"""``kimi-server search index|list|remove``: the local web-search index."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from kimi_server.search.local_index import LocalIndex
from kimi_server.search.setup import index_path
from kimi_server.settings import load_settings

search_app = typer.Typer(help="The local index the built-in web search reads.", no_args_is_help=True)
console = Console()
errors = Console(stderr=True)

ConfigOption = Annotated[Path | None, typer.Option(help="TOML settings file.")]
IndexOption = Annotated[Path | None, typer.Option(help="Index file (default: from settings).")]


def _index(config: Path | None, index: Path | None) -> LocalIndex:
    if index is not None:
        return LocalIndex(index)
    try:
        settings = load_settings(config)
    except (ValueError, OSError) as exc:  # a mistyped or missing setting: its message, no traceback
        errors.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    return LocalIndex(index_path(settings))


@search_app.command("index")
def index_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Files or directories (text, Markdown, HTML).")],
    url: Annotated[
        str | None,
        typer.Option(
            help="The http(s) URL clients see as the source: one file's own, or, ending in '/', the base "
            "each file's path below the directory is appended to. Default: a document id (doc:...)."
        ),
    ] = None,
    config: ConfigOption = None,
    index: IndexOption = None,
) -> None:
    """Adds documents (a document indexed again replaces itself); a running server sees them at once.
    Clients see each source as its --url or a document id, never its path on this server."""
    try:
        done = _index(config, index).add(paths, url=url)
    except (ValueError, OSError) as exc:
        errors.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    for doc in done:
        console.print(
            f"indexed {escape(doc.path)} as {escape(doc.url)} ({doc.chars} chars): {escape(doc.title)}",
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"{len(done)} document(s) indexed")


@search_app.command("list")
def list_cmd(config: ConfigOption = None, index: IndexOption = None) -> None:
    """Lists indexed documents: the name clients see, the file, its size and title."""
    docs = _index(config, index).documents()
    for doc in docs:
        console.print(
            f"{escape(doc.url)}\t{escape(doc.path)}\t{doc.chars}\t{escape(doc.title)}", highlight=False, soft_wrap=True
        )
    console.print(f"{len(docs)} document(s)")


@search_app.command("remove")
def remove_cmd(
    targets: Annotated[
        list[str], typer.Argument(help="Document ids, URLs given with --url, or paths (a directory: all below).")
    ],
    config: ConfigOption = None,
    index: IndexOption = None,
) -> None:
    """Removes documents from the index."""
    idx = _index(config, index)
    removed = sum(idx.remove(t) for t in targets)
    console.print(f"{removed} document(s) removed")
    if not removed:
        raise typer.Exit(1)
