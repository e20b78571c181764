"""Routes and upstreams in configuration, the engines they build, and `upstreams check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from kimi_server.bootstrap import build_engines
from kimi_server.cli import app
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.upstream.breaker import CircuitBreaker
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.settings import ModelRoute, Settings, load_settings
from tests.conftest import TEST_MODEL
from tests.test_upstream_faults import good
from tests.upstreams.fake import FakeUpstream

TOML = """
model = "{model}"
auto_pull = false

[routes."kimi-k3"]
engine = "upstream"

[[routes."kimi-k3".upstreams]]
base_url = "{url}"
dialect = "moonshot"
api_key_env = "TEST_MOONSHOT_KEY"
model = "kimi-k3"
weight = 3
capabilities = {{ vision = true, prompt_cache = true }}

[[routes."kimi-k3".upstreams]]
base_url = "http://127.0.0.1:9/v1"
dialect = "vllm"
"""


def test_routes_from_toml_build_upstream_and_embedded_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_MOONSHOT_KEY", "sk-upstream-secret")
    config = tmp_path / "kimi.toml"
    config.write_text(TOML.format(model=TEST_MODEL, url="http://127.0.0.1:8/v1"))
    monkeypatch.setenv("KIMI_CONFIG", str(config))  # what --config does, undone after the test
    settings = load_settings()
    engines = build_engines(settings)
    k3 = engines.for_model("kimi-k3")
    assert isinstance(k3, UpstreamEngine)
    first, second = k3.upstreams
    assert first.cfg.weight == 3 and first.cfg.capabilities.vision and second.cfg.dialect == "vllm"
    assert first.headers == {"Authorization": "Bearer sk-upstream-secret"}
    assert k3.accepts_images()
    assert isinstance(engines.for_model("kimi-k3.1-pro"), EmbeddedEngine)  # not routed: embedded


def test_upstream_flag_serves_every_id_without_the_embedded_model(tmp_path: Path) -> None:
    settings = Settings(upstream="http://127.0.0.1:8/v1", model="no-such-model", auto_pull=False, data_dir=tmp_path)
    engines = build_engines(settings)
    assert engines.served() == {"kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3"}
    assert all(isinstance(e, UpstreamEngine) for e in engines.unique())


def test_the_transport_is_chosen_once_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    base = {"upstream": "http://127.0.0.1:8/v1", "model": "no-such-model", "auto_pull": False, "data_dir": tmp_path}
    for env, expected in ((None, "wire"), ("httpx", "httpx")):
        if env is not None:
            monkeypatch.setenv("KIMI_UPSTREAM_TRANSPORT", env)
        engine = build_engines(load_settings(None, **base)).for_model("kimi-k3")
        assert isinstance(engine, UpstreamEngine)
        assert [up.transport.name for up in engine.upstreams] == [expected]
    monkeypatch.setenv("KIMI_UPSTREAM_TRANSPORT", "curl")
    with pytest.raises(ValueError, match="KIMI_UPSTREAM_TRANSPORT"):
        load_settings(None, **base)


def test_bad_routes_are_refused() -> None:
    with pytest.raises(ValidationError, match="needs at least one"):
        ModelRoute(engine="upstream")
    with pytest.raises(ValidationError):
        ModelRoute.model_validate({"engine": "upstream", "upstreams": [{"base_url": "x", "dialect": "tgi"}]})


def test_breaker_states_with_a_clock() -> None:
    now = [0.0]
    b = CircuitBreaker(threshold=2, cooldown=10, clock=lambda: now[0])
    states: list[str] = []  # read after each step (comparing to a literal would fix its type for mypy)
    b.failure()
    states.append(b.state)
    assert b.allow()
    b.failure()
    states.append(b.state)
    assert not b.allow()
    now[0] = 10
    states.append(b.state)
    assert b.allow()
    assert states == ["closed", "open", "half_open"]
    assert not b.allow()  # one probe at a time
    b.success()
    assert b.state == "closed"


def test_upstreams_check_cli() -> None:
    runner = CliRunner()
    with FakeUpstream(good) as up:
        result = runner.invoke(app, ["upstreams", "check", "--upstream", up.url, "--upstream-model", "m", "--json"])
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.output)
    assert report["ok"] is True and report["status"] == 200
    result = runner.invoke(app, ["upstreams", "check", "--upstream", "http://127.0.0.1:9/v1", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)[0]["reachable"] is False
