"""Printing a run: a table with one line per check, or JSON for programs."""

from __future__ import annotations

import json
from collections import Counter

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kimi_server.verify.outcome import Result, Status

STYLE = {Status.PASS: "green", Status.FAIL: "bold red", Status.SKIP: "yellow", Status.INFO: "cyan"}


LABEL = {Status.PASS: "passed", Status.FAIL: "failed", Status.SKIP: "skipped", Status.INFO: "reported"}


def summary(results: list[Result], seconds: float) -> str:
    counts = Counter(r.status for r in results)
    parts = [f"{counts[s]} {LABEL[s]}" for s in LABEL if counts[s]]
    return f"{len(results)} checks: {', '.join(parts)} in {seconds:.1f} s"


def table(results: list[Result]) -> Table:
    grid = Table(show_lines=False, pad_edge=False)
    for column in ("group", "check", "result", "detail"):
        grid.add_column(column, overflow="fold")
    for r in results:
        # Text cells: a check's "[model]" suffix is not rich markup.
        grid.add_row(Text(r.group), Text(r.check), Text(r.status.value, style=STYLE[r.status]), Text(r.detail))
    return grid


def print_table(results: list[Result], header: str, seconds: float, console: Console | None = None) -> None:
    console = console or Console()
    console.print(Text(header), highlight=False, soft_wrap=True)
    console.print(table(results))
    console.print(summary(results, seconds), highlight=False)


def as_json(results: list[Result], meta: dict[str, object], seconds: float) -> str:
    counts = Counter(r.status.value for r in results)
    return json.dumps(
        {
            **meta,
            "seconds": round(seconds, 1),
            "counts": dict(counts),
            "ok": counts.get("FAIL", 0) == 0,
            "results": [r.as_dict() for r in results],
        },
        indent=2,
    )
