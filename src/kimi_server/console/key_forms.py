"""The key form: HTML form fields to and from the admin API's own request models.

The form is built from ``KeyFields``' own fields, so a limit the admin API learns shows up
here as a plain input without a change to this module; the fields it knows get a fitting
widget. Values go through the same pydantic models (bounds, types) as the admin API's JSON.
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

# Fields with a widget of their own, or none at all.
SPECIAL = {"models", "expires_at", "allow_unpriced_budget"}
LABELS = {
    "rpm": "Requests per minute",
    "tpm": "Tokens per minute",
    "max_output_tokens": "Output tokens by default",
    "budget_usd": "Budget (USD)",
    "budget_period": "Budget starts over",
    "soft_budget_usd": "Alert at (USD, webhook)",
    "expires_at": "Expires (UTC)",
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


def form_fields() -> list[Field]:
    return [_field(n, f.annotation) for n, f in KeyFields.model_fields.items() if n not in SPECIAL]


def clearable() -> frozenset[str]:
    (inner,) = get_args(KeyUpdate.model_fields["clear"].annotation)
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


def _fields_of(form: Form) -> tuple[dict[str, Any], set[str]]:
    """The values the form sets, and the names of the fields it left empty."""
    values: dict[str, Any] = {}
    empty: set[str] = set()
    for field in form_fields():
        raw = one(form, field.name)
        if field.kind == "check":
            values[field.name] = raw in ("on", "true", "1")
        elif raw:
            values[field.name] = _value(field, raw)
        else:
            empty.add(field.name)
    expires = one(form, "expires_at")
    if expires:
        values["expires_at"] = _expiry(expires)
    else:
        empty.add("expires_at")
    models = [m for m in form.get("models", []) if m]
    if models:
        values["models"] = models
    else:
        empty.add("models")  # no model ticked: every model
    values["allow_unpriced_budget"] = one(form, "allow_unpriced_budget") == "on"
    return values, empty


def _validated(model: type[BaseModel], values: dict[str, Any]) -> Any:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequestError(f"'{where}': {first['msg']}.", param=where) from None


def create_body(form: Form) -> KeyCreate:
    values, _ = _fields_of(form)
    values["name"] = one(form, "name")
    body: KeyCreate = _validated(KeyCreate, values)
    return body


def update_body(form: Form, before: dict[str, Any]) -> KeyUpdate:
    """An update: what the form sets, and ``clear`` for each limit it emptied that was set."""
    values, empty = _fields_of(form)
    allowed = clearable()
    clear = []
    for name in sorted(empty):
        spelled = CLEAR_NAMES.get(name, name)
        if spelled in allowed and before.get(name) is not None:
            clear.append(spelled)
    values["clear"] = clear
    body: KeyUpdate = _validated(KeyUpdate, values)
    return body


def expiry_input(record: dict[str, Any]) -> str:
    value = record.get("expires_at")
    if not value:
        return ""
    return datetime.fromisoformat(str(value)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
