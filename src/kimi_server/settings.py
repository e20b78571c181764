"""One settings object. Precedence: CLI flags > environment (``KIMI_*``) > TOML file > defaults.

The TOML file is named by ``--config`` or ``KIMI_CONFIG``; see docs/configuration.md.
"""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kimi-server"


class EffortBudget(BaseModel):
    """Reasoning tokens for one effort level: at least ``floor``, at most ``cap``."""

    floor: int = Field(ge=0)
    cap: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> EffortBudget:
        if self.floor > self.cap:
            raise ValueError("floor must not exceed cap")
        return self


# Levels never overlap (low.cap <= high.floor, high.cap <= max.floor), so a higher effort always
# reasons longer; sized so a default (max) request answers in seconds on two CPU cores with the
# default model (docs/configuration.md has the measured time).
DEFAULT_BUDGETS = {
    "low": EffortBudget(floor=8, cap=32),
    "high": EffortBudget(floor=48, cap=112),
    "max": EffortBudget(floor=128, cap=256),
}
EFFORT_ORDER = ("low", "high", "max")


class ModelRoute(BaseModel):
    """What one catalogue model id runs on. Unset fields fall back to the top-level ones."""

    engine: Literal["embedded"] = "embedded"
    model: str | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KIMI_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_dir: Path = Field(default_factory=_default_data_dir)
    models_dir: Path | None = None
    # Seals reasoning in Responses output; None: <data_dir>/responses.key, made on first start.
    responses_key_file: Path | None = None

    model: str = "qwen2.5-coder-0.5b"
    auto_pull: bool = True
    routes: dict[str, ModelRoute] = Field(default_factory=dict)
    ctx_size: int = Field(default=32768, ge=256)
    parallel: int = Field(default=8, ge=1, le=256)
    threads: int = Field(default=0, ge=0)
    reasoning_format: str = "prompted"
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=0.95, gt=0, le=1)
    budgets: dict[str, EffortBudget] = Field(default_factory=lambda: dict(DEFAULT_BUDGETS))

    public_docs: bool = False  # /docs and /openapi.json without a key
    # Prompt cache (docs/caching.md). Cached sequences resident at once, the tokens they may
    # hold (default: half of ctx_size), a factor on every TTL (tests shorten them), and named
    # groups of API keys that share one cache namespace (off by default: keys are isolated).
    cache_enabled: bool = True
    cache_entries: int = Field(default=16, ge=1, le=256)
    cache_max_tokens: int | None = Field(default=None, ge=0)
    cache_ttl_scale: float = Field(default=1.0, gt=0, le=100)
    cache_groups: dict[str, list[str]] = Field(default_factory=dict)

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    engine_verbose: bool = False

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("cache_groups", mode="after")
    @classmethod
    def _one_group_per_key(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: set[str] = set()
        for keys in value.values():
            if seen & set(keys):
                raise ValueError("an API key may belong to one cache group only")
            seen |= set(keys)
        return value

    @field_validator("budgets", mode="after")
    @classmethod
    def _all_levels(cls, value: dict[str, EffortBudget]) -> dict[str, EffortBudget]:
        merged = {**DEFAULT_BUDGETS, **value}
        # Effort must order the reasoning on every request (issue 8): a level's cap may not
        # reach past the next level's floor.
        for lower, upper in pairwise(EFFORT_ORDER):
            a, b = merged.get(lower), merged.get(upper)
            if a is not None and b is not None and a.cap > b.floor:
                raise ValueError(
                    f"budgets overlap: {lower}.cap ({a.cap}) exceeds {upper}.floor ({b.floor}); "
                    "each level's cap must be at most the next level's floor"
                )
        return merged

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config = os.environ.get("KIMI_CONFIG")
        if config:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config)))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Builds settings from flags (``overrides``, ``None`` meaning unset), env and a TOML file."""
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {config_file}")
        os.environ["KIMI_CONFIG"] = str(config_file)
    given = {k: v for k, v in overrides.items() if v is not None and v != []}
    return Settings(**given)
