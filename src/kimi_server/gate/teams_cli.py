"""``kimi-server teams ...``: teams of keys with a shared budget, limits and models."""

from __future__ import annotations

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
    Tpm,
    cell,
    err,
    run,
    show_rows,
)
from kimi_server.gate.team_record import TeamRecord
from kimi_server.gate.teams import TEAM_CLEARED, TeamChanges

teams_app = typer.Typer(
    name="teams",
    help="Teams: a budget, limits and models shared by several keys.",
    no_args_is_help=True,
    add_completion=False,
)
TEAM_COLUMNS = (
    "id",
    "name",
    "rpm",
    "tpm",
    "budget_usd",
    "budget_period",
    "period_spent_usd",
    "soft_budget_usd",
    "spent_usd",
    "models",
    "capture",
)
Team = Annotated[str, typer.Argument(help="Name or id.")]


def _show(records: list[TeamRecord], as_json: bool, as_csv: bool = False) -> None:
    rows = [r.as_dict() for r in records]
    if not as_json:
        for row in rows:
            row["models"] = row["models"] or ["all"]
    show_rows(rows, TEAM_COLUMNS, as_json, as_csv)


@teams_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="A unique name for the team.")],
    budget: Budget = None,
    budget_period: Period = None,
    soft_budget: SoftBudget = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    models: Models = None,
    capture: Capture = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Creates a team; keys join it with ``keys create --team`` or ``keys update --team``."""
    changes = TeamChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=common.budget(budget),
        budget_period=budget_period,
        soft_budget_usd=common.budget(soft_budget, "--soft-budget"),
        models=common.models(models),
        capture=capture,
        allow_unpriced_budget=allow_unpriced_budget,
    )
    record = run(config, lambda s: s.teams.create(name, changes, s.actor))
    err.print(f"created team {record.id} ({cell(record.name)})", highlight=False)
    _show([record], False)


@teams_app.command("list")
def list_teams(config: Config = None, as_json: AsJson = False, as_csv: AsCsv = False) -> None:
    """Lists teams, with what their keys spent."""
    _show(run(config, lambda s: s.teams.list()), as_json, as_csv)


@teams_app.command("show")
def show(team: Team, config: Config = None, as_json: AsJson = False, as_csv: AsCsv = False) -> None:
    """Shows one team."""
    _show([run(config, lambda s: s.teams.get(team))], as_json, as_csv)


@teams_app.command("update")
def update(
    team: Team,
    budget: Budget = None,
    budget_period: Period = None,
    soft_budget: SoftBudget = None,
    rpm: Rpm = None,
    tpm: Tpm = None,
    models: Models = None,
    capture: Capture = None,
    clear: Annotated[
        list[str] | None,
        typer.Option("--clear", help="Remove a limit: rpm, tpm, budget, soft_budget or models."),
    ] = None,
    allow_unpriced_budget: AllowUnpriced = False,
    config: Config = None,
) -> None:
    """Changes a team's budget, limits, models or capture."""
    unknown = set(clear or ()) - set(TEAM_CLEARED)
    if unknown:
        raise typer.BadParameter(f"cannot clear {', '.join(sorted(unknown))}", param_hint="--clear")
    changes = TeamChanges(
        rpm=rpm,
        tpm=tpm,
        budget_usd=common.budget(budget),
        budget_period=budget_period,
        soft_budget_usd=common.budget(soft_budget, "--soft-budget"),
        models=common.models(models),
        capture=capture,
        clear=frozenset(clear or ()),
        allow_unpriced_budget=allow_unpriced_budget,
    )
    _show([run(config, lambda s: s.teams.update(team, changes, s.actor))], False)


@teams_app.command("delete")
def delete(team: Team, config: Config = None) -> None:
    """Deletes a team that has no active keys (its ledger rows keep its id)."""
    record = run(config, lambda s: s.teams.delete(team, s.actor))
    err.print(f"deleted team {record.id} ({cell(record.name)})", highlight=False)
