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

from kimi_server.cli_output import Cell, Format, print_rows
from kimi_server.errors import APIError, NotFoundError
from kimi_server.gate.key_checks import MAX_COUNT, ModelRules, check_budget, check_instant, check_text
from kimi_server.gate.keys import KeyChanges, KeyRecord, KeyStore
from kimi_server.gate.usage import GroupBy, usage_totals
from kimi_server.policy.output_caps import MAX_OUTPUT_TOKENS
from kimi_server.printable import visible
from kimi_server.store.db import Database

T = TypeVar("T")
keys_app = typer.Typer(
    name="keys", help="Create, list, change and revoke API keys.", no_args_is_help=True, add_completion=False
)
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
Expires = Annotated[str | None, typer.Option("--expires", help="Expiry: a date (UTC midnight) or ISO time.")]
Models = Annotated[str | None, typer.Option("--models", help="Comma-separated model ids this key may use.")]
MaxOutput = Annotated[
    int | None,
    typer.Option("--max-output-tokens", min=1, max=MAX_OUTPUT_TOKENS, help="Output cap of requests that name none."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]
AsCsv = Annotated[bool, typer.Option("--csv", help="Print CSV (a header, then one line per row).")]
AllowUnpriced = Annotated[
    bool,
    typer.Option("--allow-unpriced-budget", help="Keep a budget even though some of the key's models have no price."),
]
# The store's field names as this command spells them, for its error messages.
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
}


def _run(config: Path | None, work: Callable[[KeyStore], Awaitable[T]]) -> T:
    from kimi_server.settings import load_settings

    async def main() -> T:
        settings = load_settings(config)
        db = Database.from_settings(settings.database_url, settings.data_dir)
        try:
            await db.migrate()
            return await work(KeyStore(db, rules=ModelRules.from_settings(settings)))
        finally:
            await db.close()

    try:
        return asyncio.run(main())
    except APIError as exc:
        message = _naming_option(exc)
        err.print(f"[red]error:[/red] {escape(visible(message))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (ValueError, FileNotFoundError) as exc:  # settings that do not load
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


def _naming_option(exc: APIError) -> str:
    """The error as this command's user knows the field: its option, not the API's name."""
    param = exc.param or ""
    option = OPTIONS.get(param, param if param.startswith("-") else "")
    if not option:
        return exc.message
    if f"'{param}'" in exc.message:
        return exc.message.replace(f"'{param}'", option)
    return f"{option}: {exc.message}"


def _budget(value: str | None, option: str = "--budget") -> Decimal | None:
    if value is None:
        return None
    try:
        usd = check_budget(Decimal(value.removeprefix("$")))
    except InvalidOperation:
        raise typer.BadParameter(f"not an amount: {visible(value)!r}", param_hint=option) from None
    except APIError as exc:
        raise typer.BadParameter(exc.message.replace("'budget_usd' ", ""), param_hint=option) from None
    return usd


def _when(value: str | None, option: str) -> datetime | None:
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


def _models(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    models = frozenset(m.strip() for m in value.split(",") if m.strip())
    if not models:
        raise typer.BadParameter("list at least one model id", param_hint="--models")
    return models


KEY_COLUMNS = (
    "id",
    "name",
    "status",
    "rpm",
    "tpm",
    "budget_usd",
    "budget_period",
    "period_spent_usd",
    "soft_budget_usd",
    "spent_usd",
    "models",
    "max_output_tokens",
    "expires_at",
)


def _format(as_csv: bool) -> Format:
    return Format.CSV if as_csv else Format.AUTO


def _show(records: list[KeyRecord], as_json: bool, as_csv: bool = False) -> None:
    """Whole ids and names: a folded table on a terminal, tab-separated lines in a pipe."""
    if as_json:
        print(json.dumps([r.as_dict() for r in records], indent=2))
        return
    rows: list[list[Cell]] = []
    for r in records:
        d: dict[str, Any] = r.as_dict()
        d["models"] = ",".join(d["models"] or ["all"])
        rows.append([d[c] for c in KEY_COLUMNS])
    print_rows(KEY_COLUMNS, rows, _format(as_csv), out)


def _cell(text: str) -> str:
    """Stored text as a table shows it: no markup, and control characters escaped visibly."""
    return escape(visible(text))


@keys_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="A unique name for the key.")],
    rpm: Rpm = None,
    tpm: Tpm = None,
    budget: Budget = None,
    expires: Expires = None,
    models: Models = None,
    max_output_tokens: MaxOutput = None,
    budget_period: Period = None,
    soft_budget: SoftBudget = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Creates a key and prints its secret, once: only a digest of it is stored."""
    changes = KeyChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=_budget(budget),
        expires_at=_when(expires, "--expires"),
        models=_models(models),
        max_output_tokens=max_output_tokens,
        budget_period=budget_period,
        soft_budget_usd=_budget(soft_budget, "--soft-budget"),
        allow_unpriced_budget=allow_unpriced_budget,
    )
    record, secret = _run(config, lambda store: store.create(name, changes))
    err.print(f"created key {record.id} ({_cell(record.name)}); the secret is shown only now:", highlight=False)
    print(secret)


@keys_app.command("list")
def list_keys(config: Config = None, as_json: AsJson = False, as_csv: AsCsv = False) -> None:
    """Lists keys (names, ids, limits, spend so far; never secrets)."""
    _show(_run(config, lambda store: store.list()), as_json, as_csv)


@keys_app.command("show")
def show(
    key: Annotated[str, typer.Argument(help="Name or id.")],
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Shows one key."""
    _show([_run(config, lambda store: store.get(key))], as_json, as_csv)


@keys_app.command("update")
def update(
    key: Annotated[str, typer.Argument(help="Name or id.")],
    rpm: Rpm = None,
    tpm: Tpm = None,
    budget: Budget = None,
    expires: Expires = None,
    models: Models = None,
    max_output_tokens: MaxOutput = None,
    budget_period: Period = None,
    soft_budget: SoftBudget = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(
            "--clear", help="Remove a limit: rpm, tpm, budget, expires, models, max_output_tokens or soft_budget."
        ),
    ] = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Changes a key's limits."""
    unknown = set(clear or ()) - {"rpm", "tpm", "budget", "expires", "models", "max_output_tokens", "soft_budget"}
    if unknown:
        raise typer.BadParameter(f"cannot clear {', '.join(sorted(unknown))}", param_hint="--clear")
    changes = KeyChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=_budget(budget),
        expires_at=_when(expires, "--expires"),
        models=_models(models),
        max_output_tokens=max_output_tokens,
        budget_period=budget_period,
        soft_budget_usd=_budget(soft_budget, "--soft-budget"),
        clear=frozenset(clear or ()),
        allow_unpriced_budget=allow_unpriced_budget,
    )
    _show([_run(config, lambda store: store.update(key, changes))], False)


@keys_app.command("revoke")
def revoke(key: Annotated[str, typer.Argument(help="Name or id.")], config: Config = None) -> None:
    """Revokes a key: refused by every instance within a second. Its usage stays in the ledger."""
    record = _run(config, lambda store: store.revoke(key))
    err.print(f"revoked {record.id} ({_cell(record.name)})", highlight=False)


def usage(
    key: Annotated[str | None, typer.Option("--key", help="Only this key (name or id).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date or ISO time (UTC).")] = None,
    by: Annotated[str, typer.Option("--by", help="Group by model, key or day.")] = "model",
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Prints usage totals from the ledger."""
    if by not in ("model", "key", "day"):
        raise typer.BadParameter("must be model, key or day", param_hint="--by")
    start = _when(since, "--since")
    group: GroupBy = by  # type: ignore[assignment]

    async def work(store: KeyStore) -> list[dict[str, Any]]:
        key_id = None
        if key is not None:
            check_text(key, "--key")
            try:
                key_id = (await store.get(key)).id
            except NotFoundError:
                key_id = key  # a static key's id
        return await usage_totals(store.db, key_id=key_id, since=start, by=group)

    rows = _run(config, work)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    columns = [
        by,
        *(["name"] if by == "key" else []),
        "requests",
        "prompt_tokens",
        "cached_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "completion_tokens",
        "web_search_calls",
        "cost_usd",
    ]
    print_rows(columns, [[row[c] for c in columns] for row in rows], _format(as_csv), out)
