"""``kimi-server audit``: the audit trail, newest first (who changed keys and teams, who
signed in to the console, from where, what changed)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from kimi_server.gate import audit as trail
from kimi_server.gate.cli_common import AsCsv, AsJson, Config, Stores, run, show_rows, when
from kimi_server.gate.key_checks import check_text

COLUMNS = ("at", "action", "target", "who", "address", "details")


def audit(
    action: Annotated[
        str | None, typer.Option("--action", help="One action (key.rotate) or a family (key, team, console).")
    ] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only entries about this key or team id.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date or ISO time (UTC).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=trail.MAX_LISTED, help="At most this many.")] = 100,
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Lists administrative actions: who, when, from where and what changed (never a secret)."""
    start = when(since, "--since")

    async def work(s: Stores) -> list[dict[str, Any]]:
        for option, value in (("--action", action), ("--target", target)):
            if value is not None:
                check_text(value, option)
        return await trail.entries(s.db, since=start, action=action, target=target, limit=limit)

    rows = run(config, work)
    if not as_json:
        rows = [{**row, "details": json.dumps(row["details"], ensure_ascii=False)} for row in rows]
    show_rows(rows, COLUMNS, as_json, as_csv)
