"""``kimi-server models``: pull and list local GGUF models.

The main CLI mounts this with ``app.add_typer(models_app, name="models")``; it also runs alone as
``python -m kimi_server.models.cli``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kimi_server.cli_help import plain_flags

from .pull import pull
from .registry import CATALOGUE, DEFAULT_MODEL, ModelSource
from .store import LocalModel, ModelPullError, ModelStore

models_app = typer.Typer(
    name="models",
    help="Download and list the GGUF models the server can run.",
    no_args_is_help=True,
    add_completion=False,
)

ModelsDir = Annotated[
    Path | None,
    typer.Option(
        "--models-dir",
        file_okay=False,
        help="Model cache (default: $KIMI_MODELS_DIR, else ~/.cache/kimi-server/models).",
    ),
]


@models_app.command("pull")
def pull_command(
    name: Annotated[str, typer.Argument(help="A catalogue name (see `list`) or hf:ORG/REPO/FILE.gguf.")],
    force: Annotated[bool, typer.Option("--force", help="Download even if present.")] = False,
    models_dir: ModelsDir = None,
) -> None:
    """Download a model, check its size and sha256, and store it."""
    with _user_errors():
        path = pull(name, ModelStore(models_dir), force=force, console=Console(stderr=True))
    typer.echo(str(path))  # stdout carries only the path, for scripts


@models_app.command("list")
def list_command(models_dir: ModelsDir = None) -> None:
    """Show every catalogue model's state, and any other .gguf files in the models dir."""
    store = ModelStore(models_dir)
    with _user_errors():
        local = store.list()
    console = Console()
    console.print(f"Models dir: {store.root}")
    console.print(_table(store, local))


def _table(store: ModelStore, local: list[LocalModel]) -> Table:
    table = Table("NAME", "STATE", "SIZE", "PATH")
    table.columns[0].no_wrap = table.columns[1].no_wrap = table.columns[2].no_wrap = True
    table.columns[3].overflow = "fold"
    for source in CATALOGUE:
        table.add_row(*_catalogue_row(store, source))
    catalogue_names = {source.name for source in CATALOGUE}
    for model in local:
        if model.name not in catalogue_names:
            state = "verified" if model.verified else "present"
            table.add_row(model.name, state, _human(model.size), str(model.path))
    return table


def _catalogue_row(store: ModelStore, source: ModelSource) -> tuple[str, str, str, str]:
    label = f"{source.name} (default)" if source.name == DEFAULT_MODEL else source.name
    path = store.path_for(source.name)
    if path is not None:
        return label, "verified", _human(source.size_bytes), str(path)
    candidate = store.file_for(source.name)
    if candidate.is_file():
        # Not written (or no longer matching what was written) by a verified pull.
        return label, "present, unverified", _human(candidate.stat().st_size), str(candidate)
    return label, "absent", _human(source.size_bytes), "-"


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Turn expected failures into a one-line message and exit code, not a traceback."""
    errors = Console(stderr=True)
    try:
        yield
    except (ModelPullError, OSError) as exc:
        errors.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        errors.print("interrupted; nothing partial was kept")
        raise typer.Exit(130) from None


if __name__ == "__main__":
    plain_flags(models_app)()
