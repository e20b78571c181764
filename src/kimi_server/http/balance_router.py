"""``GET /v1/users/me/balance``: Kimi's balance, in Moonshot's shape, from the calling key's budget.

Kimi's platform answers ``{"code": 0, "data": {"available_balance", "voucher_balance",
"cash_balance"}, "scode": "0x0", "status": true}``. Here the balance is what is left of the
budget in force for the key in its current period: its own, or its team's where that leaves less.
Nothing here is a voucher, so ``voucher_balance`` is 0 and ``cash_balance`` is the balance. A key
with no budget has no balance: the amounts are ``null`` and ``note`` says why, rather than a made-up
figure a client would count down from.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.gate.auth import Principal
from kimi_server.gate.keys import KeyRecord, nanos_to_usd
from kimi_server.gate.money import iso
from kimi_server.gate.periods import NONE, period_end
from kimi_server.http.state import app_state, authenticated
from kimi_server.protocol.common import ErrorBody

router = APIRouter(tags=["Balance"])

NO_BUDGET = "This key has no budget, so it has no balance: its spending is not limited."
STATIC_KEY = "A static key (--api-key) has no stored budget, so it has no balance."


@dataclass(frozen=True)
class Left:
    """What one budget leaves in its period, and whose budget it is."""

    owner: str  # "key" or "team"
    nanos: int
    period: str
    resets_at: str | None


def _left(record: KeyRecord) -> Left | None:
    """The budget in force that leaves the least: the key's own or its team's."""
    found: list[Left] = []
    if record.budget_nanos is not None:
        end = period_end(record.budget_period, record.period_start)
        found.append(
            Left("key", record.budget_nanos - record.budget_spent_nanos, record.budget_period or NONE, iso(end))
        )
    team = record.team
    if team is not None and team.budget_nanos is not None:
        end = period_end(team.budget_period, team.period_start)
        found.append(Left("team", team.budget_nanos - team.budget_spent_nanos, team.budget_period or NONE, iso(end)))
    return min(found, key=lambda left: left.nanos) if found else None


def _amount(nanos: int) -> float:
    # A JSON number, as Kimi's clients read it; the ledger's exact figure is in /v1/key/info.
    return float(nanos_to_usd(max(0, nanos)).quantize(Decimal("0.000001")))


def _answer(data: dict[str, Any]) -> dict[str, Any]:
    return {"code": 0, "data": data, "scode": "0x0", "status": True}


def _unlimited(note: str) -> dict[str, Any]:
    return _answer(
        {"available_balance": None, "voucher_balance": None, "cash_balance": None, "currency": "USD", "note": note}
    )


@router.get("/v1/users/me/balance", responses={401: {"model": ErrorBody}})
async def balance(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    """The calling key's balance in Moonshot's shape: ``available_balance`` (= ``cash_balance``) is
    what is left of the budget in force this period, the key's or its team's (the smaller), in
    USD; ``voucher_balance`` is 0. ``budget_owner``, ``budget_period`` and ``budget_reset_at``
    say which budget and until when. A key with no budget gets ``null`` amounts and a ``note``."""
    gw = app_state(request).gateway
    if gw is None or principal.record is None:
        return _unlimited(STATIC_KEY)
    # Read the key again: the request-time copy may be up to a cache period old in its spend.
    left = _left(await gw.keys.get(principal.record.id))
    if left is None:
        return _unlimited(NO_BUDGET)
    amount = _amount(left.nanos)
    return _answer(
        {
            "available_balance": amount,
            "voucher_balance": 0.0,
            "cash_balance": amount,
            "currency": "USD",
            "budget_owner": left.owner,
            "budget_period": left.period,
            "budget_reset_at": left.resets_at,
        }
    )
