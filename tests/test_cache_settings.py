"""Prompt-cache settings: env parsing, shared groups resolved to key ids, validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kimi_server.bootstrap import cache_groups
from kimi_server.gate.auth import KeyRing, key_id_of
from kimi_server.settings import Settings


def test_groups_from_env_map_key_ids_to_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_CACHE_GROUPS", '{"team": ["sk-a", "sk-b"]}')
    monkeypatch.setenv("KIMI_CACHE_TTL_SCALE", "0.5")
    settings = Settings()
    assert settings.cache_ttl_scale == 0.5
    groups = cache_groups(settings)
    assert groups == {key_id_of("sk-a"): "team", key_id_of("sk-b"): "team"}
    # The ids are the ones authentication hands to the endpoints.
    principal = KeyRing(["sk-a", "sk-b", "sk-c"]).authenticate("Bearer sk-a")
    assert groups[principal.key_id] == "team"
    assert key_id_of("sk-c") not in groups


def test_a_key_may_join_one_group_only() -> None:
    with pytest.raises(ValidationError):
        Settings(cache_groups={"x": ["sk-a"], "y": ["sk-a", "sk-b"]})


def test_cache_limits_are_validated() -> None:
    with pytest.raises(ValidationError):
        Settings(cache_entries=0)
    with pytest.raises(ValidationError):
        Settings(cache_ttl_scale=0)
