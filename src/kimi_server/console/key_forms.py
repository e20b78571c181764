"""The key and team forms: HTML form fields to and from the admin API's own request models.

A form is built from the request model's own fields (``KeyFields``, ``TeamFields``), so a limit
the admin API learns shows up here as a plain input without a change to this module; the fields
it knows get a fitting widget. Values go through the same pydantic models (bounds, types) as
the admin API's JSON.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from kimi_server.console.web import Form, one
from kimi_server.errors import InvalidRequestError
from kimi_server.http.admin_router import KeyCreate, KeyFields, KeyUpdate
from kimi_server.http.admin_teams_router import TeamCreate, TeamFields, TeamUpdate

# Fields with a widget of their own, or none at all.
SPECIAL = {"models", "expires_at", "allow_unpriced_budget", "team", "tags"}
LABELS = {
    "rpm": "Requests per minute",
    "tpm": "Tokens per minute",
    "max_output_tokens": "Output tokens by default",
    "budget_usd": "Budget (USD)",
    "budget_period": "Budget starts over",
    "soft_budget_usd": "Alert at (USD, webhook)",
    "expires_at": "Expires (UTC)",
    "capture": "Keep prompts and answers",
}
# A field's name where the admin API's ``clear`` spells it otherwise.
CLEAR_NAMES = {"budget_usd": "budget", "expires_at": "expires", "soft_budget_usd": "soft_budget"}
# Text fields that take one of a few words (checked by the admin API all the same).
CHOICES = {"budget_period": ("none", "daily", "weekly", "monthly")}


@dataclass(frozen=True)
class Field:
    name: str
    label: str
    kind: Literal["number", "text", "choice", "check"]
    choices: tuple[str, ...] = ()
    step: str = "1"


def _plain(annotation: Any) -> list[Any]:
    """The types a field's annotation allows, ``None`` left out."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _field(name: str, annotation: Any) -> Field:
    label = LABELS.get(name, name.replace("_", " ").capitalize())
    if name in CHOICES:
        return Field(name, label, "choice", CHOICES[name])
    kinds = _plain(annotation)
    first = kinds[0] if kinds else str
    if get_origin(first) is Literal:
        return Field(name, label, "choice", tuple(str(a) for a in get_args(first)))
    if first is bool:
        return Field(name, label, "check")
    if first is int:
        return Field(name, label, "number")
    if name.endswith("_usd") or getattr(first, "__name__", "") in ("Decimal", "float"):
        return Field(name, label, "number", step="any")
    return Field(name, label, "text")


def form_fields(model: type[BaseModel] = KeyFields) -> list[Field]:
    return [_field(n, f.annotation) for n, f in model.model_fields.items() if n not in SPECIAL]


def team_fields() -> list[Field]:
    return form_fields(TeamFields)


def clearable(model: type[BaseModel] = KeyUpdate) -> frozenset[str]:
    (inner,) = get_args(model.model_fields["clear"].annotation)
    return frozenset(get_args(inner))


def _value(field: Field, raw: str) -> Any:
    if field.kind == "number" and field.step == "1":
        try:
            return int(raw)
        except ValueError:
            raise InvalidRequestError(f"'{field.name}' must be a whole number.", param=field.name) from None
    return raw


def _expiry(raw: str) -> str:
    """A ``datetime-local`` value (no zone) read as UTC."""
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequestError("'expires_at' is not a date and time.", param="expires_at") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()


def _fields_of(form: Form, model: type[BaseModel] = KeyFields) -> tuple[dict[str, Any], set[str]]:
    """The values the form sets, and the names of the fields it left empty."""
    values: dict[str, Any] = {}
    empty: set[str] = set()
    for field in form_fields(model):
        raw = one(form, field.name)
        if field.kind == "check":
            values[field.name] = raw in ("on", "true", "1")
        elif raw:
            values[field.name] = _value(field, raw)
        else:
            empty.add(field.name)
    if model is KeyFields:
        _key_only(form, values, empty)
    models = [m for m in form.get("models", []) if m]
    if models:
        values["models"] = models
    else:
        empty.add("models")  # no model ticked: every model
    values["allow_unpriced_budget"] = one(form, "allow_unpriced_budget") == "on"
    return values, empty


def _key_only(form: Form, values: dict[str, Any], empty: set[str]) -> None:
    """The key's own widgets: its expiry, its team (a choice) and its tags (comma-separated)."""
    for name, value in (
        ("expires_at", _expiry(one(form, "expires_at")) if one(form, "expires_at") else None),
        ("team", one(form, "team") or None),
        ("tags", [t.strip() for t in one(form, "tags").split(",") if t.strip()] or None),
    ):
        if value is None:
            empty.add(name)
        else:
            values[name] = value


def validated(model: type[BaseModel], values: dict[str, Any]) -> Any:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequestError(f"'{where}': {first['msg']}.", param=where) from None


def create_body(form: Form) -> KeyCreate:
    values, _ = _fields_of(form)
    values["name"] = one(form, "name")
    body: KeyCreate = validated(KeyCreate, values)
    return body


def _cleared(empty: set[str], before: dict[str, Any], model: type[BaseModel]) -> list[str]:
    """``clear`` for each field the form emptied that was set."""
    allowed = clearable(model)
    clear = []
    for name in sorted(empty):
        spelled = CLEAR_NAMES.get(name, name)
        if spelled in allowed and before.get(name) not in (None, []):
            clear.append(spelled)
    return clear


def update_body(form: Form, before: dict[str, Any]) -> KeyUpdate:
    """An update: what the form sets, and ``clear`` for each limit it emptied that was set."""
    values, empty = _fields_of(form)
    values["clear"] = _cleared(empty, before, KeyUpdate)
    body: KeyUpdate = validated(KeyUpdate, values)
    return body


def team_create_body(form: Form) -> TeamCreate:
    values, _ = _fields_of(form, TeamFields)
    values["name"] = one(form, "name")
    body: TeamCreate = validated(TeamCreate, values)
    return body


def team_update_body(form: Form, before: dict[str, Any]) -> TeamUpdate:
    values, empty = _fields_of(form, TeamFields)
    values["clear"] = _cleared(empty, before, TeamUpdate)
    body: TeamUpdate = validated(TeamUpdate, values)
    return body


def expiry_input(record: dict[str, Any]) -> str:
    value = record.get("expires_at")
    if not value:
        return ""
    return datetime.fromisoformat(str(value)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
