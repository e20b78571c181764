"""The command line's own output: whole ids and names in a pipe and on a narrow terminal,
``--csv``, ``--version`` and ``--help``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Annotated

import httpx
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from kimi_server import __version__
from kimi_server.cli import app as cli_app
from kimi_server.cli_help import plain_flags
from kimi_server.cli_output import Format, print_rows, table
from tests.gateway_util import chat_body, make_app, serve

LONG_NAME = "reporting-pipeline-" + "x" * 17 + "-end"  # 40 characters


def _row_with(output: str, text: str) -> list[str]:
    """What ``grep text | head -1`` then splitting on tabs gives."""
    line = next(line for line in output.splitlines() if text in line)
    return line.split("\t")


def test_piped_lists_keep_whole_ids_and_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(LONG_NAME) == 40
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "80")  # what a narrow terminal would have said
    monkeypatch.setenv("FORCE_COLOR", "1")  # as CI sets it: colour, but a pipe is still a pipe
    runner = CliRunner()  # stdout is not a terminal, as in `kimi-server keys list | grep`
    made = runner.invoke(cli_app, ["keys", "create", "--name", LONG_NAME, "--rpm", "5"])
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip().splitlines()[-1]
    listed = runner.invoke(cli_app, ["keys", "list"])
    assert listed.exit_code == 0, listed.output
    header = listed.stdout.splitlines()[0].split("\t")
    row = dict(zip(header, _row_with(listed.stdout, LONG_NAME), strict=True))
    assert row["name"] == LONG_NAME and row["rpm"] == "5" and "…" not in listed.stdout
    # The printed id is the key's id: `keys show` takes it as printed.
    shown = runner.invoke(cli_app, ["keys", "show", row["id"]])
    assert shown.exit_code == 0, shown.output
    assert _row_with(shown.stdout, row["id"])[1] == LONG_NAME

    app, _ = make_app(tmp_path)
    with serve(app) as url:
        answer = httpx.post(
            url + "/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {secret}"}
        )
        assert answer.status_code == 200
    usage = runner.invoke(cli_app, ["usage", "--by", "key"])
    assert usage.exit_code == 0, usage.output
    header = usage.stdout.splitlines()[0].split("\t")
    total = dict(zip(header, _row_with(usage.stdout, LONG_NAME), strict=True))
    assert (total["key"], total["name"], total["requests"]) == (row["id"], LONG_NAME, "1")

    as_csv = runner.invoke(cli_app, ["usage", "--by", "key", "--csv"])
    (parsed,) = csv.DictReader(io.StringIO(as_csv.stdout))
    assert (parsed["key"], parsed["name"], parsed["requests"]) == (row["id"], LONG_NAME, "1")
    keys_csv = list(csv.DictReader(io.StringIO(runner.invoke(cli_app, ["keys", "list", "--csv"]).stdout)))
    assert [(k["id"], k["name"], k["tpm"]) for k in keys_csv] == [(row["id"], LONG_NAME, "")]
    as_json = json.loads(runner.invoke(cli_app, ["keys", "list", "--json"]).stdout)
    assert as_json[0]["name"] == LONG_NAME


def _terminal(width: int) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=width, force_terminal=True, color_system=None), buffer


def test_a_narrow_terminal_shows_every_value_whole() -> None:
    columns = ["id", "name", "status", "rpm", "tpm", "budget_usd", "spent_usd", "models", "max_output_tokens"]
    row: list[str | int | None] = [
        "key_0123456789abcdef",
        LONG_NAME,
        "active",
        5,
        None,
        "2",
        "0",
        "kimi-k3,kimi-k3.1-pro",
        None,
    ]
    console, buffer = _terminal(80)
    print_rows(columns, [row], Format.TABLE, console)
    lines = buffer.getvalue().splitlines()
    assert "…" not in buffer.getvalue()
    for name, value in zip(columns, row, strict=True):  # wider than 80 columns: a block per row
        assert any(line.split() == [name, str(value if value is not None else "-")] for line in lines), name
    # A table that fits is a table, and its cells are whole too.
    console, buffer = _terminal(80)
    print_rows(["id", "name"], [["key_0123456789abcdef", LONG_NAME]], Format.TABLE, console)
    assert any(line.split() == ["key_0123456789abcdef", LONG_NAME] for line in buffer.getvalue().splitlines())


def test_a_table_cell_folds_rather_than_ending_in_an_ellipsis() -> None:
    console, buffer = _terminal(30)
    console.print(table(["name"], [[LONG_NAME]]))
    text = buffer.getvalue()
    assert "…" not in text
    folded = "".join(line.strip() for line in text.splitlines()[3:])
    assert LONG_NAME in folded and len(text.splitlines()) > 4


def test_version_and_help() -> None:
    runner = CliRunner()
    version = runner.invoke(cli_app, ["--version"])
    assert version.exit_code == 0 and version.stdout.strip() == f"kimi-server {__version__}"
    commands: list[list[str]] = [[], ["keys", "list"], ["keys", "create"], ["usage"], ["upstreams", "check"]]
    for command in [*commands, ["serve"], ["chat"], ["verify"]]:
        shown = runner.invoke(cli_app, [*command, "--help"], env={"COLUMNS": "160"})
        assert shown.exit_code == 0, shown.output
        assert "<bool>" not in shown.stdout and "<list[" not in shown.stdout, (command, shown.stdout)
        assert "--help" in shown.stdout
    # Options that take values still say which kind.
    assert "<path>" in runner.invoke(cli_app, ["keys", "list", "--help"], env={"COLUMNS": "160"}).stdout


def test_help_tidying_is_this_clis_own_not_a_patch_of_typer() -> None:
    """Only the apps given to plain_flags change: typer itself (any other app) is left as it is."""

    def build() -> typer.Typer:
        other = typer.Typer()

        @other.command()
        def run(quiet: Annotated[bool, typer.Option(help="Say less.")] = False, tag: list[str] | None = None) -> None:
            """Runs."""

        @other.command()
        def stop() -> None:
            """Stops."""

        return other

    env = {"COLUMNS": "160"}
    untouched = CliRunner().invoke(build(), ["run", "--help"], env=env).stdout
    assert "<bool>" in untouched and "<list[str]>" in untouched
    tidied = CliRunner().invoke(plain_flags(build()), ["run", "--help"], env=env).stdout
    assert "<bool>" not in tidied and "<list[" not in tidied and "<str>" in tidied and "--quiet" in tidied
