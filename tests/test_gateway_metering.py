"""Gateway: exact ledger, prices, rate limits, budgets and metrics under concurrency.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import EngineEvent, Finish, GenerationRequest
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {
    "kimi-k3.1-pro": {
        "input": "0.6",
        "cache_read": "0.15",
        "cache_write_5m": "0.75",
        "cache_write_1h": "1.2",
        "output": "2.5",
    },
    "kimi-k3": {"input": "100", "output": "100"},
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_key(c: httpx.Client, **fields: object) -> str:
    r = c.post("/admin/v1/keys", json={"name": f"k{time.monotonic_ns()}", **fields}, headers=ADMIN)
    assert r.status_code == 200, r.text
    return str(r.json()["secret"])


def ledger(tmp: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(tmp / "data" / "kimi.db") as db:
        db.row_factory = sqlite3.Row
        return {row["request_id"]: dict(row) for row in db.execute("SELECT * FROM usage")}


def expected_nanos(model: str, u: dict[str, int], ttl: str = "5m") -> int:
    p = {k: Decimal(v) for k, v in PRICES[model].items()}
    regular = u["prompt_tokens"] - u["cached_tokens"] - u["cache_write_tokens"]
    micros = (
        regular * p.get("input", Decimal(0))
        + u["cached_tokens"] * p.get("cache_read", Decimal(0))
        + u["cache_write_tokens"] * p.get(f"cache_write_{ttl}", Decimal(0))
        + u["completion_tokens"] * p.get("output", Decimal(0))
    )
    return int(micros * 1000)


def test_ledger_rows_equal_the_usage_sent_to_clients(tmp_path: Path) -> None:
    engine = ScriptedEngine(script=Script(prompt_tokens=40, cached_tokens=16))
    app, _ = make_app(tmp_path, engine, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        secret = new_key(c, rpm=1000, tpm=1_000_000, budget_usd="10", allow_unpriced_budget=True)
        sent: dict[str, dict[str, int]] = {}
        sdk = OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0)
        raw = sdk.chat.completions.with_raw_response.create(
            model="kimi-k3.1-pro", messages=[{"role": "user", "content": "Hi"}]
        )
        u = raw.parse().usage
        assert u is not None and u.prompt_tokens_details is not None and u.completion_tokens_details is not None
        sent[raw.headers["x-request-id"]] = {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "cached_tokens": u.prompt_tokens_details.cached_tokens or 0,
            "cache_write_tokens": u.model_extra.get("prompt_tokens_details", {}).get("cache_write_tokens", 24)
            if u.model_extra
            else 24,
            "reasoning_tokens": u.completion_tokens_details.reasoning_tokens or 0,
        }
        with c.stream(
            "POST", "/v1/chat/completions", json=chat_body("kimi-k3.1-pro", stream=True), headers=bearer(secret)
        ) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
            usage = httpx.Response(200, content=chunks[-1][6:]).json()["usage"]
            sent[r.headers["x-request-id"]] = flat_chat_usage(usage)
        r = c.post(
            "/v1/responses",
            json={"model": "kimi-k3.1-pro", "input": "Hi", "prompt_cache_retention": "24h"},
            headers=bearer(secret),
        )
        assert r.status_code == 200, r.text
        sent[r.headers["x-request-id"]] = flat_responses_usage(r.json()["usage"])
        with c.stream(
            "POST",
            "/v1/responses",
            json={"model": "kimi-k3.1-pro", "input": "Hi", "stream": True},
            headers=bearer(secret),
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            done = httpx.Response(200, content=lines[-1][6:]).json()
            assert done["type"] == "response.completed"
            sent[r.headers["x-request-id"]] = flat_responses_usage(done["response"]["usage"])
        key_view = c.get("/admin/v1/keys", headers=ADMIN).json()["data"][0]
    rows = ledger(tmp_path)
    assert set(rows) == set(sent)
    total = 0
    for request_id, usage in sent.items():
        row = rows[request_id]
        assert row["status"] == "completed" and row["model"] == "kimi-k3.1-pro"
        for name, value in usage.items():
            assert row[name] == value, (request_id, name)
        assert row["cost_nanos"] == expected_nanos("kimi-k3.1-pro", usage, row["cache_ttl"]) > 0
        assert row["ttft_ms"] is not None and row["duration_ms"] >= row["ttft_ms"]
        total += row["cost_nanos"]
    assert Decimal(key_view["spent_usd"]) == Decimal(total) / Decimal(10**9)


def flat_chat_usage(u: dict[str, Any]) -> dict[str, int]:
    return {
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": u["completion_tokens"],
        "cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
        "cache_write_tokens": u["prompt_tokens_details"]["cache_write_tokens"],
        "reasoning_tokens": u["completion_tokens_details"]["reasoning_tokens"],
    }


def flat_responses_usage(u: dict[str, Any]) -> dict[str, int]:
    return {
        "prompt_tokens": u["input_tokens"],
        "completion_tokens": u["output_tokens"],
        "cached_tokens": u["input_tokens_details"]["cached_tokens"],
        "cache_write_tokens": u["input_tokens_details"]["cache_write_tokens"],
        "reasoning_tokens": u["output_tokens_details"]["reasoning_tokens"],
    }


def test_rpm_limit_429_with_retry_after_and_headers(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        h = bearer(new_key(c, rpm=2, tpm=100_000))
        first = c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers=h)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(first.headers["x-ratelimit-remaining-tokens"]) < 100_000
        assert first.headers["x-ratelimit-reset-requests"].endswith("s")
        assert "retry-after" not in first.headers
        assert c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers=h).status_code == 200
        refused = c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers=h)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "requests"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        # Other routes carry the headers too, without spending a request.
        models = c.get("/v1/models", headers=h)
        assert models.headers["x-ratelimit-remaining-requests"] == "0"
        metrics = c.get("/metrics", headers=ADMIN).text
    assert 'kimi_rejections_total{reason="requests"} 1.0' in metrics
    assert len(ledger(tmp_path)) == 2  # a refused request never reached the engine


async def _burst(url: str, key: str, n: int, body: dict[str, Any]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=60, limits=limits) as c:
        return await asyncio.gather(*(c.post("/v1/chat/completions", json=body) for _ in range(n)))


def test_tpm_burst_overshoots_by_at_most_one_reservation(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    limit = 300
    with serve(app) as url, httpx.Client(base_url=url) as c:
        secret = new_key(c, tpm=limit)
        started = time.monotonic()
        responses = asyncio.run(_burst(url, secret, 200, chat_body(max_tokens=10)))
        elapsed = time.monotonic() - started
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert ok and refused
    for r in refused:
        assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
        assert int(r.headers["retry-after"]) >= 1
    for r in responses:
        assert r.headers["x-ratelimit-limit-tokens"] == str(limit)
    accepted = sum(r.json()["usage"]["total_tokens"] for r in ok)
    reservation = 34  # the prompt estimate for "Hi" (24) + max_tokens
    refill = elapsed * limit / 60
    assert accepted <= limit + reservation + refill, (accepted, elapsed)


def test_budget_holds_under_100_concurrent_requests(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    cost = expected_nanos(
        "kimi-k3", {"prompt_tokens": 12, "cached_tokens": 0, "cache_write_tokens": 0, "completion_tokens": 4}
    )
    budget_nanos = cost * 10
    with serve(app) as url, httpx.Client(base_url=url) as c:
        secret = new_key(c, budget_usd=str(Decimal(budget_nanos) / 10**9), models=["kimi-k3"])
        responses = asyncio.run(_burst(url, secret, 100, chat_body(max_tokens=4)))
        # Holds of in-flight requests may have refused some of the burst; go on until refused.
        for _ in range(20):
            after = c.post("/v1/chat/completions", json=chat_body(max_tokens=4), headers=bearer(secret))
            responses.append(after)
            if after.status_code == 429:
                break
        key = c.get("/admin/v1/keys", headers=ADMIN).json()["data"][0]
    ok = [r for r in responses if r.status_code == 200]
    for r in responses:
        if r.status_code != 200:
            # Spent, or only held by requests still in flight: each refusal says which.
            assert r.status_code == 429, r.text
            error = r.json()["error"]
            if error["type"] == "budget_held":
                assert error["code"] == "rate_limit_exceeded" and "in flight" in error["message"]
                assert int(r.headers["retry-after"]) >= 1
            else:
                assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota")
                assert "retry-after" not in r.headers
    spent = sum(row["cost_nanos"] for row in ledger(tmp_path).values())
    assert Decimal(key["spent_usd"]) * 10**9 == spent
    assert spent == len(ok) * cost
    assert after.status_code == 429 and after.json()["error"]["type"] == "insufficient_quota"
    assert budget_nanos <= spent <= budget_nanos + cost


def test_a_budget_held_by_requests_in_flight_says_so_and_admits_once_they_settle(tmp_path: Path) -> None:
    """Holds cover the most a request can cost, bounded by what the engine's context leaves
    after the prompt (not the 131,072-token default cap); a request refused while only holds
    fill the budget is told to retry, and is admitted once they settle."""
    engine = ScriptedEngine(Script(delay=0.3), window=1000)
    app, _ = make_app(tmp_path, engine, prices=PRICES)
    most = expected_nanos(
        "kimi-k3", {"prompt_tokens": 12, "cached_tokens": 0, "cache_write_tokens": 0, "completion_tokens": 1000 - 12}
    )
    with serve(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        # Room for three holds at once; the default cap's hold (131,072 output tokens) would not
        # fit even one beside another.
        secret = new_key(c, budget_usd=str(Decimal(most * 3) / 10**9), models=["kimi-k3"])
        responses = asyncio.run(_burst(url, secret, 12, chat_body()))
        ok = [r for r in responses if r.status_code == 200]
        held = [r for r in responses if r.status_code == 429]
        assert len(ok) + len(held) == len(responses)
        assert len(ok) >= 3 and held
        for r in held:
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("budget_held", "rate_limit_exceeded")
            assert r.headers["retry-after"] == "1"
        # Everything settled at its real (small) cost: the same request is admitted now.
        again = c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret))
        assert again.status_code == 200, again.text


@dataclass
class CountingEngine(ScriptedEngine):
    """Records how many deltas each generation actually produced before it ended."""

    generated: list[int] = field(default_factory=list)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        n = 0
        try:
            async for event in super().generate(request):
                if not isinstance(event, Finish):
                    n += 1
                yield event
        finally:
            self.generated.append(n)


async def _cut_off(url: str, key: str, n: int) -> None:
    async def one(c: httpx.AsyncClient, i: int) -> None:
        async with c.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    seen += 1
                    if seen >= 3 + i % 7:
                        break  # leaving closes the connection mid-stream

    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(base_url=url, headers=bearer(key), timeout=60, limits=limits) as c:
        await asyncio.gather(*(one(c, i) for i in range(n)))


def test_streams_cut_off_are_billed_for_what_was_generated(tmp_path: Path) -> None:
    engine = CountingEngine(script=Script(content=tuple(f"w{i} " for i in range(400)), delay=0.01))
    app, _ = make_app(tmp_path, engine, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        secret = new_key(c, tpm=10_000_000)
        asyncio.run(_cut_off(url, secret, 50))
        deadline = time.monotonic() + 30
        while (len(ledger(tmp_path)) < 50 or len(engine.generated) < 50) and time.monotonic() < deadline:
            time.sleep(0.1)
    rows = list(ledger(tmp_path).values())
    assert len(rows) == 50
    assert all(row["status"] == "cancelled" for row in rows)
    assert sorted(row["completion_tokens"] for row in rows) == sorted(engine.generated)
    assert all(row["completion_tokens"] < 402 for row in rows)
    assert all(row["reasoning_tokens"] == 2 for row in rows)
    assert engine.cancelled == 50


def test_metrics(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        h = bearer(STATIC_KEY)
        assert c.post("/v1/chat/completions", json=chat_body(), headers=h).status_code == 200
        with c.stream("POST", "/v1/chat/completions", json=chat_body(stream=True), headers=h) as r:
            list(r.iter_lines())
        assert c.get("/metrics").status_code == 401
        text = c.get("/metrics", headers=ADMIN).text
    assert 'kimi_requests_total{endpoint="chat.completions",model="kimi-k3",status="200"} 2.0' in text
    assert 'kimi_tokens_total{class="output",model="kimi-k3"} 8.0' in text
    assert 'kimi_time_to_first_token_seconds_count{model="kimi-k3"} 2.0' in text
    assert 'kimi_request_duration_seconds_count{endpoint="chat.completions"} 2.0' in text
    assert "kimi_streams_in_flight 0.0" in text
    assert 'kimi_engine_slots_busy{engine="scripted"}' in text
    assert 'kimi_rejections_total{reason="auth"} 1.0' in text
    open_app, _ = make_app(tmp_path / "open", metrics_public=True)
    with serve(open_app) as url:
        assert httpx.get(url + "/metrics").status_code == 200


def test_failed_requests_are_billed_for_what_they_consumed(tmp_path: Path) -> None:
    engine = ScriptedEngine(script=Script(fail_after=3))  # two reasoning deltas, one content delta
    app, _ = make_app(tmp_path, engine)
    with serve(app) as url, httpx.Client(base_url=url, headers=bearer(STATIC_KEY)) as c:
        with c.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert '"error"' in lines[-2] and lines[-1] == "data: [DONE]"
        failed = c.post("/v1/chat/completions", json=chat_body())
        assert failed.status_code == 500 and "scripted" not in failed.text
    rows = sorted(ledger(tmp_path).values(), key=lambda row: row["created_at"])
    assert [row["status"] for row in rows] == ["failed", "failed"]
    assert [row["completion_tokens"] for row in rows] == [3, 3]
    assert [row["reasoning_tokens"] for row in rows] == [2, 2]
    assert rows[1]["request_id"] == failed.headers["x-request-id"]
