"""The connection limits build on uvicorn's protocol internals: the server starts only on the
uvicorn they were written for, and says what to install otherwise (before loading a model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.http.connections import UVICORN_WRITTEN_FOR, UnsupportedUvicornError, check_uvicorn

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_pinned_uvicorn_is_the_one_the_protocol_was_written_for() -> None:
    """Raising the pin means reading http/connections.py against the new uvicorn first."""
    [pinned] = re.findall(r'"uvicorn==([^"]+)"', PYPROJECT.read_text())
    assert pinned == UVICORN_WRITTEN_FOR == uvicorn.__version__
    check_uvicorn()


def test_another_uvicorn_is_refused_with_what_to_install() -> None:
    with pytest.raises(UnsupportedUvicornError) as caught:
        check_uvicorn("0.55.0")
    message = str(caught.value)
    assert "uvicorn 0.55.0 is installed" in message and f"uvicorn=={UVICORN_WRITTEN_FOR}" in message


def test_serve_stops_before_loading_anything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.99.0")
    result = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "absent.gguf")])
    assert result.exit_code == 1
    shown = " ".join(result.output.split())
    assert "uvicorn 0.99.0 is installed" in shown and "absent.gguf" not in shown  # no model was looked at
    assert "Traceback" not in result.output
