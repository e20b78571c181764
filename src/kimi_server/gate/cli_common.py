"""What the gateway's commands share (``keys``, ``teams``, ``usage``, ``requests``, ``audit``):
the database the server uses (``KIMI_DATABASE_URL``, else SQLite under ``data_dir``), migrated
first so the commands work before the first ``serve``; errors as one line naming the option;
the options every command spells alike.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from kimi_server.cli_output import Cell, Format, print_rows
from kimi_server.errors import APIError
from kimi_server.gate.audit import Actor, cli_actor
from kimi_server.gate.key_checks import MAX_COUNT, ModelRules, check_budget, check_instant
from kimi_server.gate.keys import KeyStore
from kimi_server.gate.teams import TeamStore
from kimi_server.printable import visible
from kimi_server.store.db import Database

T = TypeVar("T")
err = Console(stderr=True)
out = Console()

Config = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
Rpm = Annotated[int | None, typer.Option("--rpm", min=1, max=MAX_COUNT, help="Requests per minute.")]
Tpm = Annotated[int | None, typer.Option("--tpm", min=1, max=MAX_COUNT, help="Tokens per minute.")]
Budget = Annotated[str | None, typer.Option("--budget", help="Budget in USD, e.g. 25 or 0.50.")]
Period = Annotated[
    str | None,
    typer.Option("--budget-period", help="When the budget starts over (UTC): none, daily, weekly or monthly."),
]
SoftBudget = Annotated[
    str | None, typer.Option("--soft-budget", help="USD spent in a period past which the budget webhook is told, once.")
]
Models = Annotated[str | None, typer.Option("--models", help="Comma-separated model ids it may use.")]
Capture = Annotated[
    bool | None,
    typer.Option("--capture/--no-capture", help="Keep prompts and answers (for capture_retention_days)."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
AsCsv = Annotated[bool, typer.Option("--csv", help="Print CSV (a header, then one line per row).")]
AllowUnpriced = Annotated[
    bool,
    typer.Option("--allow-unpriced-budget", help="Keep a budget even though some of its models have no price."),
]
# The store's field names as these commands spell them, for their error messages.
OPTIONS = {
    "name": "--name",
    "rpm": "--rpm",
    "tpm": "--tpm",
    "budget_usd": "--budget",
    "expires_at": "--expires",
    "models": "--models",
    "max_output_tokens": "--max-output-tokens",
    "key": "KEY",
    "budget_period": "--budget-period",
    "soft_budget_usd": "--soft-budget",
    "team": "--team",
    "tags": "--tags",
    "grace_seconds": "--grace",
    "status": "--status",
    "limit": "--limit",
    "slow": "--slow",
}


@dataclass(frozen=True)
class Stores:
    db: Database
    keys: KeyStore
    teams: TeamStore
    actor: Actor  # what the audit trail records for a change made here


def run(config: Path | None, work: Callable[[Stores], Awaitable[T]]) -> T:
    from kimi_server.settings import load_settings

    async def main() -> T:
        settings = load_settings(config)
        db = Database.from_settings(settings.database_url, settings.data_dir)
        try:
            await db.migrate()
            rules = ModelRules.from_settings(settings)
            return await work(Stores(db, KeyStore(db, rules=rules), TeamStore(db, rules), cli_actor()))
        finally:
            await db.close()

    try:
        return asyncio.run(main())
    except APIError as exc:
        message = naming_option(exc)
        err.print(f"[red]error:[/red] {escape(visible(message))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (ValueError, FileNotFoundError) as exc:  # settings that do not load
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def naming_option(exc: APIError) -> str:
    """The error as this command's user knows the field: its option, not the API's name."""
    param = exc.param or ""
    option = OPTIONS.get(param, param if param.startswith("-") else "")
    if not option:
        return exc.message
    if f"'{param}'" in exc.message:
        return exc.message.replace(f"'{param}'", option)
    return f"{option}: {exc.message}"


def budget(value: str | None, option: str = "--budget") -> Decimal | None:
    if value is None:
        return None
    try:
        usd = check_budget(Decimal(value.removeprefix("$")))
    except InvalidOperation:
        raise typer.BadParameter(f"not an amount: {visible(value)!r}", param_hint=option) from None
    except APIError as exc:
        raise typer.BadParameter(exc.message.replace("'budget_usd' ", ""), param_hint=option) from None
    return usd


def when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            return datetime(d.year, d.month, d.day, tzinfo=UTC)
        at = datetime.fromisoformat(value)
        return check_instant(at if at.tzinfo else at.replace(tzinfo=UTC), option)
    except ValueError:
        raise typer.BadParameter(f"not a date or ISO time: {visible(value)!r}", param_hint=option) from None
    except APIError as exc:
        raise typer.BadParameter(exc.message.replace(f"'{option}' ", ""), param_hint=option) from None


def models(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    found = frozenset(m.strip() for m in value.split(",") if m.strip())
    if not found:
        raise typer.BadParameter("list at least one model id", param_hint="--models")
    return found


def output_format(as_csv: bool) -> Format:
    return Format.CSV if as_csv else Format.AUTO


def cell(text: str) -> str:
    """Stored text as a table shows it: no markup, and control characters escaped visibly."""
    return escape(visible(text))


def show_rows(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool, as_csv: bool) -> None:
    """Rows as JSON, CSV, or a table of ``columns`` (lists joined with commas)."""
    if as_json:
        print(json.dumps(list(rows), indent=2, default=str))
        return
    table: list[list[Cell]] = []
    for row in rows:
        table.append([",".join(row[c]) if isinstance(row[c], list) else row[c] for c in columns])
    print_rows(columns, table, output_format(as_csv), out)
