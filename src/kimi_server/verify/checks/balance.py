"""The balance (``GET /users/me/balance``) in Kimi's shape: ``{"code": 0, "data":
{"available_balance", "voucher_balance", "cash_balance"}, "scode": "0x0", "status": true}``, the
amounts numbers (or, on kimi-server, all ``null`` with a ``note`` for a key without a budget),
and a balance that does not grow when the key spends. An endpoint without the route skips."""

from __future__ import annotations

from typing import Any

from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, Target, error_text

PATH = "/users/me/balance"
AMOUNTS = ("available_balance", "voucher_balance", "cash_balance")


def _balance(t: Target) -> dict[str, Any]:
    resp = t.http.get(t.base_url + PATH, headers={"Authorization": f"Bearer {t.key}"})
    if resp.status_code in (404, 405):
        raise Skipped(f"the endpoint has no balance (GET {PATH}: HTTP {resp.status_code})")
    expect(resp.status_code == 200, f"HTTP {resp.status_code}: {error_text(resp)}")
    body = resp.json()
    expect(isinstance(body, dict) and isinstance(body.get("data"), dict), f"no data object: {resp.text[:120]!r}")
    expect(
        body.get("code") == 0 and body.get("status") is True, f"code/status {body.get('code')!r}/{body.get('status')!r}"
    )
    data: dict[str, Any] = body["data"]
    missing = [k for k in AMOUNTS if k not in data]
    expect(not missing, f"data lacks {missing}")
    return data


def _numbers(data: dict[str, Any]) -> bool:
    numbers = [isinstance(data[k], int | float) and not isinstance(data[k], bool) for k in AMOUNTS]
    nulls = [data[k] is None for k in AMOUNTS]
    expect(all(numbers) or (all(nulls) and bool(data.get("note"))), f"amounts neither numbers nor explained: {data}")
    return all(numbers)


@check("balance", "Kimi's shape")
def shape(t: Target, model: str) -> str:
    data = _balance(t)
    if not _numbers(data):
        return f"no balance: {data['note']}"
    expect(data["available_balance"] >= 0, f"available_balance {data['available_balance']} is negative")
    return f"available {data['available_balance']}"


@check("balance", "does not grow when the key spends", serial=True)
def spending(t: Target, model: str) -> str:
    before = _balance(t)
    if not _numbers(before):
        raise Skipped(f"the key has no balance: {before['note']}")
    t.chat(model=model, max_completion_tokens=ACCEPT_TOKENS, **t.low_effort(model))
    after = _balance(t)
    expect(_numbers(after), "the balance disappeared after a request")
    expect(
        after["available_balance"] <= before["available_balance"],
        f"{before['available_balance']} → {after['available_balance']}",
    )
    return f"{before['available_balance']} → {after['available_balance']}"
