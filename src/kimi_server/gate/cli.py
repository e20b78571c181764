"""``kimi-server keys ...`` and ``kimi-server usage``: the gateway from the command line.

Both talk to the database the server uses (``KIMI_DATABASE_URL``, else SQLite under
``data_dir``), migrating it first, so they work before the first ``serve`` too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kimi_server.errors import APIError
from kimi_server.gate.keys import KeyChanges, KeyRecord, KeyStore
from kimi_server.gate.usage import GroupBy, usage_totals
from kimi_server.store.db import Database

T = TypeVar("T")
keys_app = typer.Typer(name="keys", help="Create, list, change and revoke API keys.", no_args_is_help=True,
                       add_completion=False)
err = Console(stderr=True)
out = Console()

Config = Annotated[Path | None, typer.Option("--config", help="TOML settings file.")]
Rpm = Annotated[int | None, typer.Option("--rpm", min=1, help="Requests per minute.")]
Tpm = Annotated[int | None, typer.Option("--tpm", min=1, help="Tokens per minute.")]
Budget = Annotated[str | None, typer.Option("--budget", help="Budget in USD, e.g. 25 or 0.50.")]
Expires = Annotated[str | None, typer.Option("--expires", help="Expiry: a date (UTC midnight) or ISO time.")]
Models = Annotated[str | None, typer.Option("--models", help="Comma-separated model ids this key may use.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _run(config: Path | None, work: Callable[[Database], Awaitable[T]]) -> T:
    from kimi_server.settings import load_settings

    async def main() -> T:
        settings = load_settings(config)
        db = Database.from_settings(settings.database_url, settings.data_dir)
        try:
            await db.migrate()
            return await work(db)
        finally:
            await db.close()

    try:
        return asyncio.run(main())
    except APIError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(1) from None


def _budget(value: str | None) -> Decimal | None:
    if value is None:
        return None
    try:
        usd = Decimal(value.removeprefix("$"))
    except InvalidOperation:
        raise typer.BadParameter(f"not an amount: {value!r}", param_hint="--budget") from None
    if usd < 0 or not usd.is_finite():
        raise typer.BadParameter("must be a non-negative amount", param_hint="--budget")
    return usd


def _expires(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            return datetime(d.year, d.month, d.day, tzinfo=UTC)
        at = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"not a date or ISO time: {value!r}", param_hint="--expires") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _models(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    models = frozenset(m.strip() for m in value.split(",") if m.strip())
    if not models:
        raise typer.BadParameter("list at least one model id", param_hint="--models")
    return models


def _show(records: list[KeyRecord], as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return
    table = Table("id", "name", "status", "rpm", "tpm", "budget $", "spent $", "models", "expires")
    for r in records:
        d: dict[str, Any] = r.as_dict()
        table.add_row(
            d["id"], escape(d["name"]), d["status"], str(d["rpm"] or "-"), str(d["tpm"] or "-"),
            d["budget_usd"] or "-", d["spent_usd"], escape(",".join(d["models"] or ["all"])),
            d["expires_at"] or "-",
        )
    out.print(table)


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="A unique name for the key.")],
    rpm: Rpm = None, tpm: Tpm = None, budget: Budget = None, expires: Expires = None, models: Models = None,
    config: Config = None,
) -> None:
    """Creates a key and prints its secret, once: only a digest of it is stored."""
    changes = KeyChanges(rpm, tpm, _budget(budget), _expires(expires), _models(models))
    record, secret = _run(config, lambda db: KeyStore(db).create(name, changes))
    err.print(f"created key {record.id} ({escape(record.name)}); the secret is shown only now:")
    print(secret)


@keys_app.command("list")
def list_keys(config: Config = None, as_json: AsJson = False) -> None:
    """Lists keys (names, ids, limits, spend so far; never secrets)."""
    _show(_run(config, lambda db: KeyStore(db).list()), as_json)


@keys_app.command("show")
def show(
    key: Annotated[str, typer.Argument(help="Name or id.")], config: Config = None, as_json: AsJson = False
) -> None:
    """Shows one key."""
    _show([_run(config, lambda db: KeyStore(db).get(key))], as_json)


@keys_app.command("update")
def update(
    key: Annotated[str, typer.Argument(help="Name or id.")],
    rpm: Rpm = None, tpm: Tpm = None, budget: Budget = None, expires: Expires = None, models: Models = None,
    clear: Annotated[
        list[str] | None, typer.Option("--clear", help="Remove a limit: rpm, tpm, budget, expires or models.")
    ] = None,
    config: Config = None,
) -> None:
    """Changes a key's limits."""
    unknown = set(clear or ()) - {"rpm", "tpm", "budget", "expires", "models"}
    if unknown:
        raise typer.BadParameter(f"cannot clear {', '.join(sorted(unknown))}", param_hint="--clear")
    changes = KeyChanges(rpm, tpm, _budget(budget), _expires(expires), _models(models), frozenset(clear or ()))
    _show([_run(config, lambda db: KeyStore(db).update(key, changes))], False)


@keys_app.command("revoke")
def revoke(key: Annotated[str, typer.Argument(help="Name or id.")], config: Config = None) -> None:
    """Revokes a key: refused by every instance within a second. Its usage stays in the ledger."""
    record = _run(config, lambda db: KeyStore(db).revoke(key))
    err.print(f"revoked {record.id} ({escape(record.name)})")


def usage(
    key: Annotated[str | None, typer.Option("--key", help="Only this key (name or id).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date or ISO time (UTC).")] = None,
    by: Annotated[str, typer.Option("--by", help="Group by model, key or day.")] = "model",
    config: Config = None,
    as_json: AsJson = False,
) -> None:
    """Prints usage totals from the ledger."""
    if by not in ("model", "key", "day"):
        raise typer.BadParameter("must be model, key or day", param_hint="--by")
    start = _expires(since)
    group: GroupBy = by  # type: ignore[assignment]

    async def work(db: Database) -> list[dict[str, Any]]:
        key_id = None
        if key is not None:
            try:
                key_id = (await KeyStore(db).get(key)).id
            except APIError:
                key_id = key  # a static key's id
        return await usage_totals(db, key_id=key_id, since=start, by=group)

    rows = _run(config, work)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    columns = [by, *(["name"] if by == "key" else []), "requests", "prompt_tokens", "cached_tokens",
               "cache_write_tokens", "reasoning_tokens", "completion_tokens", "web_search_calls", "cost_usd"]
    table = Table(*columns)
    for row in rows:
        table.add_row(*(escape(str(row[c])) for c in columns))
    out.print(table)
