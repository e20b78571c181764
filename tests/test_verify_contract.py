"""``kimi-server verify``'s ``contract`` group against the real server (its own policy code, a
scripted engine, a real socket) on each contract profile: held to the contract it follows every
probe passes; held to the other, every rule the two disagree on fails, whichever way round.
And what a server says it lacks (``capabilities.prompt_cache: false`` in ``GET /models``) is
skipped, not failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.engines.scripted import ScriptedEngine
from tests.conftest import TEST_KEY, build_app
from tests.gateway_util import serve

MODELS = ("kimi-k3.1-pro", "kimi-k3")
# The rules that differ on every model, and those that differ only where sampling is fixed.
DIFFER_ON_EVERY_MODEL = {"declared in GET /models", "tool name length", "thinking switch", "thinking values"}
DIFFER_ON_KIMI_K3 = {"penalties", "temperature with thinking disabled"}


@contextmanager
def server(tmp_path: Path, **settings: Any) -> Iterator[str]:
    with serve(build_app(tmp_path / "data", ScriptedEngine(), **settings)) as url:
        yield f"{url}/v1"


def verify(url: str, contract: str, *extra: str, models: tuple[str, ...] = MODELS) -> tuple[int, list[dict[str, Any]]]:
    models_args = [arg for m in models for arg in ("--model", m)]
    args = ["verify", url, "--key", TEST_KEY, "--contract", contract, "--json", "--timeout", "30", *models_args, *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, json.loads(result.stdout)["results"]


def failed(results: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Model -> the names of the contract checks that failed on it."""
    out: dict[str, set[str]] = {m: set() for m in MODELS}
    for r in results:
        if r["status"] == "FAIL":
            name, _, model = r["check"].rpartition(" [")
            out[model.rstrip("]")].add(name)
    return out


def wrong_on(*models: str) -> dict[str, set[str]]:
    return {
        m: (DIFFER_ON_EVERY_MODEL | (DIFFER_ON_KIMI_K3 if m == "kimi-k3" else set())) if m in models else set()
        for m in MODELS
    }


@pytest.mark.parametrize("profile", ["evolink", "moonshot"])
def test_each_profile_passes_its_own_contract_and_fails_the_other(tmp_path: Path, profile: str) -> None:
    other = "moonshot" if profile == "evolink" else "evolink"
    with server(tmp_path, contract=profile) as url:
        own_code, own = verify(url, profile, "--only", "contract")
        other_code, held_to_other = verify(url, other, "--only", "contract")
    assert failed(own) == wrong_on(), own
    assert own_code == 0
    skipped = {r["check"]: r["detail"] for r in own if r["status"] == "SKIP"}
    assert skipped == {
        "temperature with thinking disabled [kimi-k3.1-pro]": (
            "this model's sampling fields are not fixed under either contract"
        )
    }
    assert failed(held_to_other) == wrong_on(*MODELS), held_to_other
    assert other_code == 1


def test_the_failures_say_which_way_the_endpoint_differs(tmp_path: Path) -> None:
    with server(tmp_path, contract="evolink") as url:
        _, as_moonshot = verify(url, "moonshot", "--only", "contract")
    with server(tmp_path / "m", contract="moonshot") as url:
        _, as_evolink = verify(url, "evolink", "--only", "contract")
    details = {f"{r['check']}": r["detail"] for r in as_moonshot}
    # Names of exactly the longest length the contract allows are sent, not only one over.
    assert details["tool name length [kimi-k3.1-pro]"].startswith(
        "a 256-character name in request tools (the moonshot limit): refused, HTTP 400:"
    )
    assert details["declared in GET /models [kimi-k3]"] == "GET /models says kimi-k3 follows 'evolink', not 'moonshot'"
    assert details["thinking switch [kimi-k3.1-pro]"] == "reasoning_content present with thinking disabled"
    assert details["penalties [kimi-k3]"].startswith("presence_penalty 0.5: expected 400, got 200")
    details = {f"{r['check']}": r["detail"] for r in as_evolink}
    assert details["tool name length [kimi-k3.1-pro]"].startswith(
        "a 65-character name in request tools (over the evolink limit): expected 400, got 200"
    )
    assert details["thinking switch [kimi-k3]"] == (
        "thinking disabled turned reasoning off: the evolink contract ignores the field"
    )
    assert details["thinking values [kimi-k3.1-pro]"].startswith('thinking {"type": "sometimes"}: refused, HTTP 400')
    assert details["temperature with thinking disabled [kimi-k3]"].startswith(
        "temperature 1 with thinking disabled (the field ignored): refused, HTTP 400"
    )


def test_a_route_on_the_other_contract_fails_only_that_model(tmp_path: Path) -> None:
    with server(tmp_path, contract="evolink", routes={"kimi-k3": {"contract": "moonshot"}}) as url:
        code, results = verify(url, "evolink", "--only", "contract")
    assert failed(results) == wrong_on("kimi-k3")
    assert code == 1


UPSTREAM_WITHOUT_CACHE = {
    "engine": "upstream",
    "upstreams": [{"base_url": "http://127.0.0.1:9/v1", "capabilities": {"prompt_cache": False}}],
}


def test_a_model_the_server_says_has_no_prompt_cache_skips_the_cache_check(tmp_path: Path) -> None:
    with server(tmp_path, routes={"kimi-k3": UPSTREAM_WITHOUT_CACHE}) as url:
        listed = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {TEST_KEY}"}).json()["data"]
        skip_code, without = verify(url, "evolink", "--only", "cache", models=("kimi-k3",))
        fail_code, with_cache = verify(url, "evolink", "--only", "cache", models=("kimi-k3.1-pro",))
    caps = {m["id"]: m["capabilities"] for m in listed}
    assert caps["kimi-k3"] == {"prompt_cache": False, "exact_token_count": False}
    assert caps["kimi-k3.1-pro"] == {"prompt_cache": True, "exact_token_count": False}  # the cache is on
    assert [(r["status"], r["detail"]) for r in without] == [
        ("SKIP", "GET /models says kimi-k3 has no prompt cache (capabilities.prompt_cache: false)")
    ]
    assert skip_code == 0
    # A model the server says has a cache is held to it: the scripted engine reports no hit.
    assert [r["status"] for r in with_cache] == ["FAIL"]
    assert "cached_tokens 0 on the second call" in with_cache[0]["detail"]
    assert fail_code == 1


def test_the_embedded_cache_switched_off_is_declared(tmp_path: Path) -> None:
    with server(tmp_path, cache_enabled=False) as url:
        code, results = verify(url, "evolink", "--only", "cache", models=("kimi-k3.1-pro",))
    assert [r["status"] for r in results] == ["SKIP"]
    assert code == 0
