"""Starting real upstreams for tests: llama.cpp's own HTTP server in a child process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir
from tests.conftest import TEST_MODEL, _free_port, require_mark


@contextmanager
def llamacpp_server(tmp: Path, model: str = TEST_MODEL) -> Iterator[str]:
    """Yields the base URL (…/v1) of a llama.cpp server on a free loopback port."""
    require_mark("e2e", "starts llama.cpp's server")
    path = resolve_model(model, ModelStore(default_models_dir()), auto_pull=False)
    port = _free_port()
    log = tmp / "llamacpp.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.upstreams.llamacpp_server", str(path), str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited:\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama.cpp server did not become healthy")
            time.sleep(0.2)
        yield f"{url}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
