"""Shared fixtures: a scripted-engine app for contract tests, and the real server for e2e tests.

Tests that start a server or engine process, or load the real model, are marked ``e2e``; tests
that need PostgreSQL or Redis are marked ``integration``. The helpers that do either check the
mark of the running test, so an unmarked one fails at once instead of slowing the fast set.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kimi_server.engines.base import Engine
from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.gate.auth import KeyRing
from kimi_server.http.app import create_app
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings

TEST_KEY = "sk-test-key"
OTHER_KEY = "sk-other-key"
TEST_MODEL = "smollm2-135m"
# Small reasoning budgets keep the real-model tests quick on two cores; the levels still differ,
# and never overlap (a level's cap is below the next one's floor).
TEST_BUDGETS = '{"low": {"floor": 8, "cap": 24}, "high": {"floor": 32, "cap": 64}, "max": {"floor": 72, "cap": 128}}'


@pytest.fixture(autouse=True)
def _config_file_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    # load_settings(--config) records the file in KIMI_CONFIG for the rest of the process, as the
    # CLI needs; a test that calls it must not hand its file to the tests after it.
    monkeypatch.delenv("KIMI_CONFIG", raising=False)


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


# The slowest modules (minutes of generation on two cores), first: with ``--dist loadfile``
# each module runs whole on one test process, so these start at once, side by side, and the
# short ones fill in around them, instead of one process running a long module alone at the end.
SLOW_FIRST = (
    "test_verify_e2e",
    "test_structured_e2e",
    "test_structured_responses_e2e",
    "test_web_search_e2e",
    "test_fuzz_real_model",
    "test_system_tools_e2e",
    "test_tools_default_model",
    "test_claude_code_e2e",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(SLOW_FIRST)))  # stable: the rest keep their order


_running_marks: set[str] = set()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up, so session-scoped servers see the right marks.
    _running_marks.clear()
    _running_marks.update(mark.name for mark in item.iter_markers())


def require_mark(name: str, what: str) -> None:
    """Fails the running test when it is not marked ``name`` although it needs ``what``."""
    if name not in _running_marks:
        pytest.fail(f"{what}: mark the test @pytest.mark.{name}", pytrace=False)


def scripted_engines(engine: Engine) -> EngineSet:
    """Every catalogue model served by the one ``engine``."""
    return EngineSet({spec.id: engine for spec in CATALOGUE})


def build_app(
    data_dir: Path, engine: Engine | None = None, *, keys: Sequence[str] = (TEST_KEY,), **settings: Any
) -> FastAPI:
    """The real app with ``engine`` (a fresh ScriptedEngine by default) serving every catalogue
    model; ``keys`` are the static API keys, ``settings`` any other Settings fields."""
    config = Settings(api_keys=list(keys), data_dir=data_dir, **settings)
    return create_app(config, scripted_engines(engine or ScriptedEngine()), KeyRing(list(keys)))


class ScriptedApp(Protocol):
    def __call__(
        self,
        engine: Engine | None = None,
        *,
        keys: Sequence[str] = ...,
        key: str | None = ...,
        anonymous: bool = ...,
        **settings: Any,
    ) -> TestClient: ...


@pytest.fixture
def scripted_app(tmp_path: Path) -> ScriptedApp:
    """Makes a TestClient (enter it with ``with``) for the app around a scripted engine, sending
    ``key`` (the first of ``keys`` by default; no key with ``anonymous``) on every request. Server
    errors come back as 500s, as a client would see them."""

    def make(
        engine: Engine | None = None,
        *,
        keys: Sequence[str] = (TEST_KEY,),
        key: str | None = None,
        anonymous: bool = False,
        **settings: Any,
    ) -> TestClient:
        app = build_app(settings.pop("data_dir", tmp_path / "data"), engine, keys=keys, **settings)
        sent = key or keys[0]
        headers = {} if anonymous else {"Authorization": f"Bearer {sent}"}
        return TestClient(app, headers=headers, raise_server_exceptions=False)

    return make


@pytest.fixture
def client(engine: ScriptedEngine, scripted_app: ScriptedApp) -> Iterator[TestClient]:
    with scripted_app(engine, keys=[TEST_KEY, OTHER_KEY]) as c:
        yield c


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    key: str
    other_key: str
    log: Path


def start_server(
    tmp: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], LiveServer]:
    require_mark("e2e", "starts a kimi-server process")
    port = _free_port()
    log = tmp / "server.log"
    full_env = {
        **os.environ,
        "KIMI_DATA_DIR": str(tmp / "data"),
        "KIMI_BUDGETS": TEST_BUDGETS,
        "KIMI_AUTO_PULL": "true",
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "kimi_server.cli",
        "serve",
        "--port",
        str(port),
        "--model",
        TEST_MODEL,
        "--api-key",
        TEST_KEY,
        "--api-key",
        OTHER_KEY,
        "--parallel",
        "8",
        "--ctx-size",
        "16384",
        *extra,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, LiveServer(f"{url}/v1", TEST_KEY, OTHER_KEY, log)
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become healthy in time")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server (real tiny model through llama.cpp) shared by the e2e tests."""
    proc, server = start_server(tmp_path_factory.mktemp("live"))
    try:
        yield server
    finally:
        stop_server(proc)


# models are found where the server looks for them.
def model_path(name: str) -> Path:
    """Where the server would find catalogue model ``name``: ``$KIMI_MODELS_DIR``, else
    ``$XDG_CACHE_HOME/kimi-server/models``, else ``~/.cache/kimi-server/models``."""
    from kimi_server.models.store import ModelStore, default_models_dir

    return ModelStore(default_models_dir()).file_for(name)


# the default model, shared by every module that needs it.
DEFAULT_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def default_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A real server on the default model (qwen2.5-coder-0.5b), with the test budgets."""
    proc, server = start_server(tmp_path_factory.mktemp("default-model"), "--model", DEFAULT_MODEL)
    try:
        yield server
    finally:
        stop_server(proc)
