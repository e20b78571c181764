"""A mistyped setting stops start-up with a message naming it and the nearest valid key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_server.settings import load_settings
from kimi_server.unknown_settings import UnknownSettingError


def run_cli(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh process; no model can load (none is there to pull)."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("KIMI_")}
    clean.update(KIMI_DATA_DIR=str(tmp / "data"), KIMI_MODELS_DIR=str(tmp / "models"), KIMI_AUTO_PULL="false")
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", *args], env=clean, capture_output=True, text=True, timeout=120
    )


def test_serve_refuses_mistyped_toml_keys(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('ctx_sise = 4096\n[prices.x]\ninptu = "1"\n')
    done = run_cli(tmp_path, "serve", "--config", str(bad))
    assert done.returncode != 0
    assert "unknown setting 'ctx_sise'; did you mean 'ctx_size'?" in done.stderr, done.stderr
    assert "unknown setting 'prices.x.inptu'; did you mean 'input'?" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_other_commands_name_the_mistyped_key_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("ctx_sise = 4096\n")
    for command in (["search", "list"], ["keys", "list"]):
        done = run_cli(tmp_path, *command, "--config", str(bad))
        assert done.returncode == 1, (command, done.stderr)
        assert "did you mean 'ctx_size'?" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_price_must_name_a_served_model(tmp_path: Path) -> None:
    bad = tmp_path / "prices.toml"
    bad.write_text('[prices."kimi-k3.1pro"]\ninput = "1"\n')
    for command in (["serve"], ["keys", "list"]):
        done = run_cli(tmp_path, *command, "--config", str(bad))
        assert done.returncode != 0, (command, done.stderr)
        assert "prices: 'kimi-k3.1pro' is not a model this server serves; did you mean 'kimi-k3.1-pro'?" in " ".join(
            done.stderr.split()
        ), done.stderr
        assert "Traceback" not in done.stderr
    good = tmp_path / "route.toml"  # a route's own id may carry a price
    good.write_text('[routes.house]\nmodel = "some.gguf"\n[prices.house]\ninput = "1"\n')
    assert run_cli(tmp_path, "keys", "list", "--config", str(good)).returncode == 0


def test_an_unknown_environment_variable_is_a_warning_unless_strict(tmp_path: Path) -> None:
    """The environment is shared with other tools (one may well use KIMI_*): a variable that
    names no setting is said, with the nearest one, and the command goes on; with
    strict_settings (environment or file) it stops, as an unknown key in the file always does."""
    done = run_cli(tmp_path, "keys", "list", KIMI_CTX_SISE="4096", KIMI_OTHER_TOOL_HOME="/opt/other")
    assert done.returncode == 0, done.stderr
    assert "unknown environment variable KIMI_CTX_SISE" in done.stderr, done.stderr
    assert "did you mean 'KIMI_CTX_SIZE'?" in done.stderr and "KIMI_OTHER_TOOL_HOME" in done.stderr
    assert "Traceback" not in done.stderr
    strict = run_cli(tmp_path, "keys", "list", KIMI_CTX_SISE="4096", KIMI_STRICT_SETTINGS="true")
    assert strict.returncode == 1
    assert "did you mean 'KIMI_CTX_SIZE'?" in strict.stderr and "strict_settings is on" in strict.stderr
    config = tmp_path / "strict.toml"
    config.write_text("strict_settings = true\n")
    strict = run_cli(tmp_path, "serve", "--config", str(config), KIMI_CTX_SISE="4096")
    assert strict.returncode != 0 and "KIMI_CTX_SISE" in strict.stderr, strict.stderr


def test_a_bad_value_is_named_as_it_was_written(tmp_path: Path) -> None:
    """KIMI_PORT=abc names KIMI_PORT (not pydantic's field, port); a flag names the flag and the
    file its key; a secret's value is never repeated."""
    done = run_cli(tmp_path, "keys", "list", KIMI_PORT="abc")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "KIMI_PORT = 'abc': Input should be a valid integer" in done.stderr, done.stderr
    assert "validation error" not in done.stderr
    flag = run_cli(tmp_path, "serve", "--parallel", "0")
    assert flag.returncode == 1 and "--parallel = 0: Input should be greater than or equal to 1" in flag.stderr
    config = tmp_path / "bad-values.toml"
    config.write_text('port = "eighty"\nbudget_webhook_secret = "short"\n')
    done = run_cli(tmp_path, "keys", "list", "--config", str(config))
    said = " ".join(done.stderr.split())
    assert f"'port' in {config} = 'eighty': Input should be a valid integer" in said, done.stderr
    assert f"'budget_webhook_secret' in {config}: String should have at least 16 characters" in said
    assert "short" not in done.stderr.replace("String should", "")


def test_known_and_allowed_variables_pass(tmp_path: Path) -> None:
    # An upstream's key may live in a KIMI_* variable when a setting names it.
    done = run_cli(tmp_path, "keys", "list", KIMI_CONFIG=str(tmp_path / "absent.toml"))
    assert done.returncode != 0 and "absent.toml" in done.stderr  # the config file's name is no setting
    done = run_cli(
        tmp_path,
        "keys",
        "list",
        KIMI_CTX_SIZE="4096",
        KIMI_TEST_POSTGRES="postgresql://x/y",
        KIMI_UPSTREAM_API_KEY_ENV="KIMI_VLLM_KEY",
        KIMI_VLLM_KEY="secret",
    )
    assert done.returncode == 0, done.stderr


def test_nested_tables_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "routes.toml"
    monkeypatch.setenv("KIMI_CONFIG", str(config))  # as --config would set it, undone after the test
    config.write_text(
        '[routes.kimi-k3]\nengine = "upstream"\n[[routes.kimi-k3.upstreams]]\n'
        'base_url = "http://127.0.0.1:9/v1"\nwieght = 2\n[routes.kimi-k3.upstreams.capabilities]\n'
        "tool = false\n[budgets.low]\nflor = 1\ncap = 2\n"
    )
    with pytest.raises(UnknownSettingError) as raised:
        load_settings()
    message = str(raised.value)
    assert "'routes.kimi-k3.upstreams[0].wieght'; did you mean 'weight'?" in message
    assert "'routes.kimi-k3.upstreams[0].capabilities.tool'; did you mean 'tools'?" in message
    assert "'budgets.low.flor'; did you mean 'floor'?" in message


def test_json_values_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KIMI_CONFIG", raising=False)
    monkeypatch.setenv("KIMI_PRICES", '{"kimi-k3": {"inptu": "1"}}')
    with pytest.raises(UnknownSettingError, match=r"'prices\.kimi-k3\.inptu'; did you mean 'input'\?"):
        load_settings()
