"""The dashboards under deploy/ query what the server exports: every metric the Grafana
dashboard's PromQL names, with every label it filters or groups on, is in the real server's
/metrics after traffic (the embedded tiny model, one route relayed to an upstream on a real
socket, a stored key with a limit, a wrong key); the Prometheus example scrapes with the admin key."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.upstreams.fake import Conn, FakeUpstream, chunk

pytestmark = pytest.mark.e2e
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ADMIN_KEY = "sk-admin-dashboards-test"
PRICES = {"kimi-k3.1-pro": {"input": "0.6", "output": "2.5"}, "kimi-k3": {"input": "0.6", "output": "2.5"}}
SELECTOR = re.compile(r"\b(kimi_[a-z0-9_]+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[dict[str, str]]]


def dashboard_queries() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    board = json.loads((DEPLOY / "grafana" / "kimi-server.json").read_text())
    return list(walk(board["panels"]))


def parse_metrics(text: str) -> Samples:
    samples: Samples = defaultdict(list)
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found and not line.startswith("#"):
            samples[found[1]].append(dict(LABEL.findall(found[2] or "")))
    return samples


def matches(labels: dict[str, str], name: str, op: str, value: str) -> bool:
    actual = labels.get(name, "")
    return {
        "=": actual == value,
        "!=": actual != value,
        "=~": re.fullmatch(value, actual) is not None,
        "!~": re.fullmatch(value, actual) is None,
    }[op]


def upstream_answer() -> FakeUpstream:
    """An OpenAI-compatible upstream that reports cached prompt tokens."""

    async def handler(body: dict[str, Any], conn: Conn) -> None:
        await conn.head()
        await conn.event(chunk({"role": "assistant", "reasoning_content": "Thinking."}))
        await conn.event(chunk({"content": "Fine."}, "stop"))
        usage = {
            "prompt_tokens": 40,
            "completion_tokens": 3,
            "total_tokens": 43,
            "prompt_tokens_details": {"cached_tokens": 32},
        }
        await conn.event({**chunk({}), "choices": [], "usage": usage})
        await conn.done()

    return FakeUpstream(handler)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with upstream_answer() as upstream:
        routes = {"kimi-k3": {"engine": "upstream", "upstreams": [{"base_url": upstream.url, "name": "fake"}]}}
        env = {"KIMI_THREADS": "1", "KIMI_PRICES": json.dumps(PRICES), "KIMI_ROUTES": json.dumps(routes)}
        tmp = tmp_path_factory.mktemp("dashboards")
        proc, live = start_server(tmp, "--admin-key", ADMIN_KEY, env=env)
        try:
            yield live
        finally:
            stop_server(proc)


def drive_traffic(server: LiveServer) -> None:
    sdk = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0)
    low = {"reasoning_effort": "low"}
    for _ in range(2):  # the embedded engine, streamed: the second reuses the first's prompt
        stream = sdk.chat.completions.create(
            model="kimi-k3.1-pro",
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=low,
        )
        assert [c for c in stream]
    sdk.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}])  # the upstream
    origin = server.base_url.removesuffix("/v1")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(f"{origin}/admin/v1/keys", json={"name": "dash", "rpm": 1}, headers=admin, timeout=30)
    limited = openai.OpenAI(base_url=server.base_url, api_key=created.json()["secret"], max_retries=0)
    limited.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.RateLimitError):  # rpm 1: a 429 with its reason
        limited.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0).models.list()


def test_every_dashboard_query_finds_its_metrics(server: LiveServer) -> None:
    drive_traffic(server)
    origin = server.base_url.removesuffix("/v1")
    scraped = httpx.get(f"{origin}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert scraped.status_code == 200
    samples = parse_metrics(scraped.text)
    queries = dashboard_queries()
    assert len(queries) >= 15
    names: set[str] = set()
    for query in queries:
        selectors = SELECTOR.findall(query)
        assert selectors, query
        for name, matchers in selectors:
            names.add(name)
            assert samples.get(name), f"{name} (in {query}) is not in /metrics"
            wanted = MATCHER.findall(matchers)
            assert any(all(matches(s, *m) for m in wanted) for s in samples[name]), (name, wanted)
        labels = {label for name, _ in selectors for s in samples[name] for label in s}
        for grouping in GROUPING.findall(query):
            for label in (x.strip() for x in grouping.split(",")):
                assert label in labels, f"{query} groups by {label}, which {selectors} lack"
    # what the dashboard is for: each of these is on it.
    assert {
        "kimi_requests_total",
        "kimi_request_duration_seconds_bucket",
        "kimi_time_to_first_token_seconds_bucket",
        "kimi_tokens_total",
        "kimi_rejections_total",
        "kimi_engine_queued",
        "kimi_engine_slots_busy",
        "kimi_prompt_cache_hits_total",
        "kimi_upstream_breaker_state",
        "kimi_spend_usd_total",
    } <= names
    breakers = [s for s in samples["kimi_upstream_breaker_state"] if s["upstream"] == "fake"]
    assert {s["state"] for s in breakers} == {"closed", "open", "half_open"}


def test_every_alert_rule_finds_its_metrics_and_labels(server: LiveServer) -> None:
    """deploy/prometheus/alerts.yml (loaded by the example's rule_files): every metric a rule's
    expression names is exported, with the labels it filters and groups on."""
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert re.search(r"^rule_files:\s*\n\s*-\s*alerts\.yml", config, re.M)
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    alerts = re.findall(r"^\s*- alert:\s*(\w+)", rules, re.M)
    exprs = re.findall(r"^\s*expr:\s*(.+)$", rules, re.M)
    assert alerts == ["KimiBudgetSpent", "KimiKeyExpiringSoon", "KimiUpstreamBreakerOpen"] and len(exprs) == 3
    origin = server.base_url.removesuffix("/v1")
    scraped = httpx.get(f"{origin}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    samples = parse_metrics(scraped.text)
    for expr in exprs:
        for name, matchers in SELECTOR.findall(expr):
            assert samples.get(name), f"{name} (in {expr}) is not in /metrics"
            labels = {label for s in samples[name] for label in s}
            for label, _, _ in MATCHER.findall(matchers):
                assert label in labels, (name, label)
            for grouping in GROUPING.findall(expr):
                for label in (x.strip() for x in grouping.split(",")):
                    assert label in labels | {"instance"}, (expr, label)  # Prometheus adds instance


def test_the_prometheus_example_scrapes_with_the_admin_key(server: LiveServer) -> None:
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    path = re.search(r"^\s*metrics_path:\s*(\S+)", config, re.M)
    kind = re.search(r"^\s*authorization:\s*\n\s*type:\s*(\w+)", config, re.M)
    assert path is not None and kind is not None
    origin = server.base_url.removesuffix("/v1")
    url = origin + path[1]
    assert httpx.get(url, headers={"Authorization": f"{kind[1]} {ADMIN_KEY}"}, timeout=30).status_code == 200
    assert httpx.get(url, timeout=30).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"{kind[1]} {server.key}"}, timeout=30).status_code == 403
