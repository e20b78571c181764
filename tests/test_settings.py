"""Settings precedence (flags > env > TOML > defaults) and the serve command's start-up errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.gate.auth import KeyRing, development_key
from kimi_server.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KIMI_CONFIG", "KIMI_PORT", "KIMI_API_KEYS", "KIMI_BUDGETS", "KIMI_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "kimi.toml"
    toml.write_text('port = 9001\nmodel = "from-toml"\nparallel = 3\n[budgets.low]\nfloor = 1\ncap = 2\n')
    monkeypatch.setenv("KIMI_PORT", "9002")
    settings = load_settings(toml, model="from-flag")
    assert settings.model == "from-flag"  # flag beats TOML
    assert settings.port == 9002  # env beats TOML
    assert settings.parallel == 3  # TOML beats default
    assert settings.budgets["low"].cap == 2
    assert settings.budgets["max"].cap == 256  # levels not named keep their defaults


def test_api_keys_from_env_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_API_KEYS", "sk-a, sk-b")
    assert load_settings().api_keys == ["sk-a", "sk-b"]
    assert load_settings(api_keys=["sk-c"]).api_keys == ["sk-c"]


def test_budgets_from_env_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_BUDGETS", '{"high": {"floor": 100, "cap": 120}}')
    settings = load_settings()
    assert settings.budgets["high"].floor == 100
    assert settings.budgets["low"].cap == 96


def test_overlapping_budgets_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A level's cap past the next level's floor would let a lower effort out-think
    a higher one; the operator hears which pair overlaps."""
    monkeypatch.setenv("KIMI_BUDGETS", '{"high": {"floor": 5, "cap": 9}}')
    with pytest.raises(ValueError, match=r"low\.cap \(96\) exceeds high\.floor \(5\)"):
        load_settings()
    monkeypatch.setenv("KIMI_BUDGETS", '{"max": {"floor": 100, "cap": 900}}')
    with pytest.raises(ValueError, match=r"high\.cap \(128\) exceeds max\.floor"):
        load_settings()
    monkeypatch.setenv("KIMI_BUDGETS", '{"low": {"floor": 0, "cap": 48}, "high": {"floor": 48, "cap": 60}}')
    assert load_settings().budgets["high"].floor == 48  # touching is allowed


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_BUDGETS", '{"low": {"floor": 50, "cap": 9}}')
    with pytest.raises(ValueError, match="floor"):
        load_settings()


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "absent.toml")


def test_development_key_is_kept_private_and_stable(tmp_path: Path) -> None:
    key = development_key(tmp_path)
    assert key.startswith("sk-kimi-") and development_key(tmp_path) == key
    assert (tmp_path / "dev-api-key").stat().st_mode & 0o077 == 0
    ring = KeyRing([key])
    assert ring.authenticate(f"Bearer {key}").key_id
    assert key not in repr(ring.__dict__)  # only digests are held


def test_serve_with_unknown_model_exits_cleanly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["serve", "--model", "no-such-model", "--models-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no-such-model" in result.output
    assert "Traceback" not in result.output
