"""Rows printed by the command line, whole: a table on a terminal, plain lines in a pipe.

Ids and names are never cut. On a terminal: a rich table whose long cells fold onto more lines,
or, when it is wider than the terminal, one block of "column  value" lines per row;
anywhere else (a pipe, a file) each row is one line of tab-separated values with a header, so
``grep NAME`` finds the row and ``cut -f1`` gives ids to paste into other commands. ``--csv``
and ``--json`` are for programs. Cells pass through ``printable.visible`` first: a stored name
cannot move the cursor or split a row (a tab or newline in it is printed as an escape).
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Sequence
from enum import Enum

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kimi_server.printable import visible

Cell = str | int | None
EMPTY = "-"


class Format(Enum):
    AUTO = "auto"  # a table on a terminal, tab-separated lines elsewhere
    TABLE = "table"
    PLAIN = "plain"
    CSV = "csv"


def print_rows(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], fmt: Format = Format.AUTO, console: Console | None = None
) -> None:
    console = console or Console()
    if fmt is Format.AUTO:
        fmt = Format.TABLE if _tty(console) else Format.PLAIN
    if fmt is Format.TABLE:
        grid = table(columns, rows)
        natural = console.measure(grid, options=console.options.update_width(1 << 16)).maximum
        fits = natural <= console.width
        # Too wide for the terminal: one block of "column  value" lines per row reads better
        # than every cell folded into a narrow strip.
        console.print(grid if fits or not rows else records(columns, rows))
    elif fmt is Format.CSV:
        sys.stdout.write(as_csv(columns, rows))
    else:
        sys.stdout.write(as_plain(columns, rows))


def _tty(console: Console) -> bool:
    """Whether the output really is a terminal: rich's own test also says yes under FORCE_COLOR,
    which a CI log sets, and a pipe must get lines to grep whatever the environment says."""
    isatty = getattr(console.file, "isatty", None)
    return bool(isatty and isatty())


def _text(cell: Cell, empty: str) -> str:
    return empty if cell is None or cell == "" else visible(str(cell))


def table(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> Table:
    """A rich table whose cells fold onto more lines instead of ending in an ellipsis."""
    grid = Table(box=box.SIMPLE_HEAD)  # no column rules: more of a narrow terminal for the values
    for name in columns:
        grid.add_column(name, overflow="fold", no_wrap=False)
    for row in ([_text(cell, EMPTY) for cell in row] for row in rows):
        # Text, not a markup string: a name such as "[red]" prints as written.
        grid.add_row(*(Text(cell) for cell in row))
    return grid


def records(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> Group:
    blocks: list[RenderableType] = []
    for row in rows:
        block = Table.grid(padding=(0, 2))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")
        for name, cell in zip(columns, row, strict=True):
            block.add_row(name, Text(_text(cell, EMPTY)))
        blocks += [block, Text("")]
    return Group(*blocks[:-1])


def as_plain(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    lines = ["\t".join(columns), *("\t".join(_text(cell, EMPTY) for cell in row) for row in rows)]
    return "\n".join(lines) + "\n"


def as_csv(columns: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_text(cell, "") for cell in row] for row in rows)
    return buffer.getvalue()
