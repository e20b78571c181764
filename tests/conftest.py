"""Shared fixtures: a scripted-engine app for contract tests, and the real server for e2e tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

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


@pytest.fixture
def client(engine: ScriptedEngine, tmp_path: Path) -> Iterator[TestClient]:
    engines = EngineSet({spec.id: engine for spec in CATALOGUE})
    settings = Settings(api_keys=[TEST_KEY], data_dir=tmp_path / "data")
    app = create_app(settings, engines, KeyRing([TEST_KEY, OTHER_KEY]))
    auth = {"Authorization": f"Bearer {TEST_KEY}"}
    with TestClient(app, headers=auth, raise_server_exceptions=False) as c:
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
        sys.executable, "-m", "kimi_server.cli", "serve",
        "--port", str(port), "--model", TEST_MODEL,
        "--api-key", TEST_KEY, "--api-key", OTHER_KEY,
        "--parallel", "8", "--ctx-size", "16384", *extra,
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
