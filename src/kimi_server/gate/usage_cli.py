"""``kimi-server usage``: the ledger's totals by model, key, team, tag or day."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from kimi_server.errors import NotFoundError
from kimi_server.gate.cli_common import AsCsv, AsJson, Config, Stores, run, show_rows, when
from kimi_server.gate.key_checks import check_text
from kimi_server.gate.usage import GROUPS, GroupBy, usage_totals

SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "completion_tokens",
    "web_search_calls",
    "cost_usd",
)


async def key_id_named(s: Stores, key: str | None) -> str | None:
    """A stored key's id by name or id; anything else is taken as a static key's id."""
    if key is None:
        return None
    check_text(key, "--key")
    try:
        return (await s.keys.get(key)).id
    except NotFoundError:
        return key


async def team_id_named(s: Stores, team: str | None) -> str | None:
    """A team's id by name or id; anything else is taken as a deleted team's id."""
    if team is None:
        return None
    check_text(team, "--team")
    try:
        return (await s.teams.get(team)).id
    except NotFoundError:
        return team


def usage(
    key: Annotated[str | None, typer.Option("--key", help="Only this key (name or id).")] = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team (name or id).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date or ISO time (UTC).")] = None,
    by: Annotated[str, typer.Option("--by", help="Group by model, key, team, tag or day.")] = "model",
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Prints usage totals from the ledger. By tag, a request counts under each tag of its key."""
    if by not in GROUPS:
        raise typer.BadParameter("must be model, key, team, tag or day", param_hint="--by")
    start = when(since, "--since")
    group: GroupBy = by  # type: ignore[assignment]

    async def work(s: Stores) -> list[dict[str, Any]]:
        key_id, team_id = await key_id_named(s, key), await team_id_named(s, team)
        return await usage_totals(s.db, key_id=key_id, team_id=team_id, since=start, by=group)

    rows = run(config, work)
    show_rows(rows, [by, *(["name"] if by in ("key", "team") else []), *SUMS], as_json, as_csv)
