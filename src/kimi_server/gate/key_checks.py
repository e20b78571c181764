"""What a stored key's fields may hold, checked before anything reaches the database.

The admin API and the CLI share these checks, so every bad value is a 400 (or a CLI error)
naming the field, never a database error. Bounds come from the columns and must hold on both
SQLite and PostgreSQL: ``rpm`` and ``tpm`` are INTEGER (32-bit on PostgreSQL), money is BIGINT
nano-dollars, and PostgreSQL text cannot hold a NUL character.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from kimi_server.errors import InvalidRequestError
from kimi_server.gate.periods import NONE, PERIODS
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.settings import ModelPrice, Settings

MAX_COUNT = 2**31 - 1  # INTEGER columns: PostgreSQL's is 32-bit
NANO_PLACES = 9  # money is stored as whole nano-dollars
MAX_BUDGET_USD = Decimal(2**63 - 1).scaleb(-NANO_PLACES)  # BIGINT nano-dollars
MAX_NAME_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 64
MAX_GRACE_SECONDS = 30 * 86_400  # a replaced secret is accepted at most this long after a rotation
# Stored keys are "key_" + 16 hex digits; a static key's id is 16 hex digits. A name of that
# shape would make "show KEY" and "usage --key KEY" ambiguous between a name and an id.
KEY_ID_SHAPE = re.compile(r"(key_)?[0-9a-f]{16}", re.IGNORECASE)
TEAM_ID_SHAPE = re.compile(r"team_[0-9a-f]{16}", re.IGNORECASE)  # likewise for a team's name
# Bidirectional overrides and isolates: they reorder what a terminal shows after them.
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI_CONTROLS


def check_text(value: str, param: str) -> str:
    """No NUL, control or bidi-override characters, nor lone surrogates."""
    if any(_is_control(ch) for ch in value):
        raise InvalidRequestError(f"'{param}' must not contain control characters.", param=param)
    return value


def check_count(value: int | None, param: str) -> int | None:
    if value is not None and not 1 <= value <= MAX_COUNT:
        raise InvalidRequestError(f"'{param}' must be between 1 and {MAX_COUNT}.", param=param)
    return value


def check_budget(value: Decimal | None, param: str = "budget_usd") -> Decimal | None:
    if value is None:
        return None
    if not value.is_finite() or value < 0 or value > MAX_BUDGET_USD:
        raise InvalidRequestError(f"'{param}' must be a finite amount from 0 to {MAX_BUDGET_USD} USD.", param=param)
    exponent = value.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > NANO_PLACES:
        raise InvalidRequestError(f"'{param}' may have at most {NANO_PLACES} decimal places.", param=param)
    return value


def check_period(value: str | None, param: str = "budget_period") -> str | None:
    """A budget period by name; ``none`` is a lifetime budget (stored as None)."""
    if value is None:
        return None
    if value not in (*PERIODS, NONE):
        raise InvalidRequestError(
            f"'{param}' must be one of: {NONE}, {', '.join(PERIODS)} (periods start in UTC).", param=param
        )
    return value


def check_soft_budget(
    soft_nanos: int | None, budget_nanos: int | None, param: str = "soft_budget_usd", whose: str = "key"
) -> None:
    """A soft budget warns before the budget refuses: it must be below it when both are set."""
    if soft_nanos is not None and budget_nanos is not None and soft_nanos >= budget_nanos:
        raise InvalidRequestError(f"'{param}' must be less than the {whose}'s budget (budget_usd).", param=param)


def check_instant(value: datetime, param: str) -> datetime:
    """The same instant in UTC, which every database can store (years 1 to 9999)."""
    if value.tzinfo is None:
        raise InvalidRequestError(f"'{param}' needs a time zone (e.g. 2027-01-01T00:00:00Z).", param=param)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidRequestError(f"'{param}' must be between the years 1 and 9999 in UTC.", param=param) from None


def check_expiry(value: datetime | None, now: datetime, param: str = "expires_at") -> datetime | None:
    if value is None:
        return None
    if check_instant(value, param) <= now:
        raise InvalidRequestError(f"'{param}' must be in the future.", param=param)
    return value


def check_name(name: str) -> str:
    if not name.strip() or len(name) > MAX_NAME_CHARS:
        raise InvalidRequestError(f"'name' must be 1 to {MAX_NAME_CHARS} characters.", param="name")
    check_text(name, "name")
    if KEY_ID_SHAPE.fullmatch(name) or TEAM_ID_SHAPE.fullmatch(name):
        raise InvalidRequestError(
            "'name' must not look like a key id or a team id ('key_' or 'team_' and 16 hex digits, or 16 hex digits).",
            param="name",
        )
    return name


def check_tags(tags: Iterable[str] | None, param: str = "tags") -> tuple[str, ...] | None:
    """Tags as stored: trimmed, each 1 to 64 characters without commas, at most 20, in order."""
    if tags is None:
        return None
    kept: list[str] = []
    for raw in tags:
        tag = check_text(raw, param).strip()
        if not tag or len(tag) > MAX_TAG_CHARS or "," in tag:
            raise InvalidRequestError(
                f"'{param}': each tag is 1 to {MAX_TAG_CHARS} characters, without commas.", param=param
            )
        if tag not in kept:
            kept.append(tag)
    if len(kept) > MAX_TAGS:
        raise InvalidRequestError(f"'{param}': at most {MAX_TAGS} tags.", param=param)
    return tuple(kept)


def check_grace(seconds: int, param: str = "grace_seconds") -> int:
    if not 0 <= seconds <= MAX_GRACE_SECONDS:
        raise InvalidRequestError(f"'{param}' must be between 0 and {MAX_GRACE_SECONDS} seconds.", param=param)
    return seconds


@dataclass(frozen=True)
class ModelRules:
    """The model ids a key may be limited to, and which of them have a price."""

    known: frozenset[str]
    priced: frozenset[str]

    @classmethod
    def catalogue_only(cls) -> ModelRules:
        """Without settings: the catalogue's models, none of them priced."""
        return cls(frozenset(spec.id for spec in CATALOGUE), frozenset())

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelRules:
        known = frozenset(spec.id for spec in CATALOGUE) | frozenset(settings.routes)
        priced = frozenset(model for model, price in settings.prices.items() if _charges(price))
        return cls(known, priced)

    def check_models(self, models: Iterable[str] | None, param: str = "models") -> None:
        if models is None:
            return
        models = list(models)
        if not models:
            raise InvalidRequestError(f"'{param}' must list at least one model id.", param=param)
        for model in models:
            check_text(model, param)
            if "," in model:  # the column keeps the list comma-separated: never a comma in an id
                raise InvalidRequestError(f"'{param}': one model id per entry, without commas.", param=param)
            if model not in self.known:
                shown = model if len(model) <= 100 else model[:100] + "..."
                raise InvalidRequestError(
                    f"'{param}': unknown model {shown!r}; known models: {', '.join(sorted(self.known))}.",
                    param=param,
                )

    def unpriced(self, models: Iterable[str] | None) -> list[str]:
        """The models (all known ones when ``None``) on which a budget could never be spent."""
        return sorted(set(self.known if models is None else models) - self.priced)

    def check_spend(self, budget_nanos: int | None, models: Iterable[str] | None, *, allowed: bool) -> None:
        if budget_nanos is None or allowed:
            return
        unpriced = self.unpriced(models)
        if unpriced:
            raise InvalidRequestError(
                f"No price is configured for {', '.join(unpriced)} ([prices] in the settings), so a budget "
                "would never be spent there. Configure prices, limit the key's models to priced ones, "
                "or confirm with allow_unpriced_budget (CLI: --allow-unpriced-budget).",
                param="budget_usd",
                code="unpriced_budget",
            )


def _charges(price: ModelPrice) -> bool:
    return any(value > 0 for _, value in price)
