"""``kimi-server keys ...``: stored API keys from the command line (create, list, show, update,
rotate, revoke). Changes made here are in the audit trail as the command line's."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from kimi_server.gate import cli_common as common
from kimi_server.gate.cli_common import (
    AllowUnpriced,
    AsCsv,
    AsJson,
    Budget,
    Capture,
    Config,
    Models,
    Period,
    Rpm,
    SoftBudget,
    Stores,
    Tpm,
    cell,
    err,
    run,
    show_rows,
)
from kimi_server.gate.key_changes import CLEARED
from kimi_server.gate.key_checks import MAX_GRACE_SECONDS
from kimi_server.gate.keys import KeyChanges, KeyRecord
from kimi_server.policy.output_caps import MAX_OUTPUT_TOKENS

keys_app = typer.Typer(
    name="keys", help="Create, list, change, rotate and revoke API keys.", no_args_is_help=True, add_completion=False
)

Expires = Annotated[str | None, typer.Option("--expires", help="Expiry: a date (UTC midnight) or ISO time.")]
MaxOutput = Annotated[
    int | None,
    typer.Option("--max-output-tokens", min=1, max=MAX_OUTPUT_TOKENS, help="Output cap of requests that name none."),
]
Team = Annotated[
    str | None, typer.Option("--team", help="The team (name or id) whose budget and limits bound the key.")
]
Tags = Annotated[str | None, typer.Option("--tags", help="Comma-separated tags, for cost attribution.")]
KEY_COLUMNS = (
    "id",
    "name",
    "status",
    "team",
    "tags",
    "rpm",
    "tpm",
    "budget_usd",
    "budget_period",
    "period_spent_usd",
    "soft_budget_usd",
    "spent_usd",
    "models",
    "max_output_tokens",
    "capture",
    "expires_at",
)


def _tags(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(t.strip() for t in value.split(",") if t.strip())


def _show(records: list[KeyRecord], as_json: bool, as_csv: bool = False) -> None:
    """Whole ids and names: a folded table on a terminal, tab-separated lines in a pipe."""
    rows = [r.as_dict() for r in records]
    if not as_json:
        for row in rows:
            row["models"] = row["models"] or ["all"]
    show_rows(rows, KEY_COLUMNS, as_json, as_csv)


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
    team: Team = None,
    tags: Tags = None,
    capture: Capture = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Creates a key and prints its secret, once: only a digest of it is stored."""
    changes = KeyChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=common.budget(budget),
        expires_at=common.when(expires, "--expires"),
        models=common.models(models),
        max_output_tokens=max_output_tokens,
        budget_period=budget_period,
        soft_budget_usd=common.budget(soft_budget, "--soft-budget"),
        team=team,
        tags=_tags(tags),
        capture=capture,
        allow_unpriced_budget=allow_unpriced_budget,
    )
    record, secret = run(config, lambda s: s.keys.create(name, changes, s.actor))
    err.print(f"created key {record.id} ({cell(record.name)}); the secret is shown only now:", highlight=False)
    print(secret)


@keys_app.command("list")
def list_keys(config: Config = None, as_json: AsJson = False, as_csv: AsCsv = False) -> None:
    """Lists keys (names, ids, teams, tags, limits, spend so far; never secrets)."""
    _show(run(config, lambda s: s.keys.list()), as_json, as_csv)


@keys_app.command("show")
def show(
    key: Annotated[str, typer.Argument(help="Name or id.")],
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Shows one key."""
    _show([run(config, lambda s: s.keys.get(key))], as_json, as_csv)


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
    team: Team = None,
    tags: Tags = None,
    capture: Capture = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(
            "--clear",
            help="Remove a limit or setting: rpm, tpm, budget, expires, models, max_output_tokens, soft_budget, "
            "team or tags.",
        ),
    ] = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Changes a key's limits, team, tags or capture."""
    unknown = set(clear or ()) - set(CLEARED)
    if unknown:
        raise typer.BadParameter(f"cannot clear {', '.join(sorted(unknown))}", param_hint="--clear")
    changes = KeyChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=common.budget(budget),
        expires_at=common.when(expires, "--expires"),
        models=common.models(models),
        max_output_tokens=max_output_tokens,
        budget_period=budget_period,
        soft_budget_usd=common.budget(soft_budget, "--soft-budget"),
        team=team,
        tags=_tags(tags),
        capture=capture,
        clear=frozenset(clear or ()),
        allow_unpriced_budget=allow_unpriced_budget,
    )
    _show([run(config, lambda s: s.keys.update(key, changes, s.actor))], False)


@keys_app.command("rotate")
def rotate(
    key: Annotated[str, typer.Argument(help="Name or id.")],
    grace: Annotated[
        int,
        typer.Option(
            "--grace", min=0, max=MAX_GRACE_SECONDS, help="Seconds the old secret is still accepted (0: refused now)."
        ),
    ] = 0,
    config: Config = None,
) -> None:
    """Gives a key a new secret, printed once; its id, limits, team and history stay."""
    record, secret = run(config, lambda s: s.keys.rotate(key, grace, s.actor))
    until = record.previous_expires_at
    old = f"the old one is accepted until {until.isoformat()}" if until else "the old one is refused from now on"
    err.print(
        f"rotated key {record.id} ({cell(record.name)}); {old}. The new secret is shown only now:", highlight=False
    )
    print(secret)


@keys_app.command("revoke")
def revoke(key: Annotated[str, typer.Argument(help="Name or id.")], config: Config = None) -> None:
    """Revokes a key: refused by every instance within a second. Its usage stays in the ledger.
    A key revoked before is left as it was, and the command says so with exit status 1."""

    async def work(stores: Stores) -> tuple[datetime | None, KeyRecord]:
        before = (await stores.keys.get(key)).revoked_at
        return before, await stores.keys.revoke(key, stores.actor)

    before, record = run(config, work)
    if before is not None:
        err.print(f"{record.id} ({cell(record.name)}) was already revoked at {before.isoformat()}", highlight=False)
        raise typer.Exit(1)
    err.print(f"revoked {record.id} ({cell(record.name)})", highlight=False)
