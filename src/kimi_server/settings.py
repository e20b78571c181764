"""One settings object. Precedence: CLI flags > environment (``KIMI_*``) > TOML file > defaults.

The TOML file is named by ``--config`` or ``KIMI_CONFIG``; see docs/configuration.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from kimi_server.policy.aliases import DEFAULT_ALIASES
from kimi_server.policy.profiles import ContractName
from kimi_server.settings_errors import explain_invalid
from kimi_server.settings_tables import (
    DEFAULT_BUDGETS,
    EFFORT_ORDER,
    BaseURL,
    Dialect,
    EffortBudget,
    ModelPrice,
    ModelRoute,
    UpstreamCapabilities,
    UpstreamConfig,
)
from kimi_server.unknown_settings import (
    UnknownSettingError,
    check_price_models,
    check_toml_file,
    explain_extras,
    unknown_environment,
)

__all__ = [
    "DEFAULT_BUDGETS",
    "EFFORT_ORDER",
    "Dialect",
    "EffortBudget",
    "ModelPrice",
    "ModelRoute",
    "Settings",
    "UpstreamCapabilities",
    "UpstreamConfig",
    "load_settings",
]
# The TOML file of the settings being built (load_settings sets it for the duration of the build,
# so nothing is written to the process environment); else KIMI_CONFIG names it.
_config_file: ContextVar[Path | None] = ContextVar("kimi_config_file", default=None)
log = logging.getLogger(__name__)


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kimi-server"


class Settings(BaseSettings):
    # Unknown keys are errors (load_settings names the nearest valid one).
    model_config = SettingsConfigDict(env_prefix="KIMI_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    data_dir: Path = Field(default_factory=_default_data_dir)
    models_dir: Path | None = None
    # Seals reasoning in Responses output; None: <data_dir>/responses.key, made on first start.
    responses_key_file: Path | None = None
    # Seals the web console's sign-in cookie; None: <data_dir>/console.key, made on first start.
    console_key_file: Path | None = None

    model: str = "qwen2.5-coder-0.5b"
    auto_pull: bool = True
    # Whose API rules the server follows: "evolink" (the reference in shared/spec) or
    # "moonshot" (Moonshot's own: the thinking switch, fixed sampling); see policy/profiles.py.
    contract: ContractName = "evolink"
    routes: dict[str, ModelRoute] = Field(default_factory=dict)
    ctx_size: int = Field(default=32768, ge=256)
    parallel: int = Field(default=8, ge=1, le=256)
    threads: int = Field(default=0, ge=0)  # 0: one per core this process may run on
    # How long llama.cpp's threads spin before sleeping: "auto" spins while the machine's other
    # work leaves the cores free and sleeps at once while it does not (wait_governor.py); or a
    # fixed level 0-100 (llama.cpp's own default: 50; 0 sleeps at once).
    cpu_poll: Annotated[int, Field(ge=0, le=100)] | Literal["auto"] = "auto"
    # The repetition guard (embedded engine): a generation whose end is the same n-gram of at
    # most repetition_max_ngram tokens (0: off), at least repetition_min_repeats times in a
    # row over at least repetition_min_tokens tokens, ends with finish_reason "length".
    repetition_max_ngram: int = Field(default=32, ge=0, le=256)
    repetition_min_repeats: int = Field(default=4, ge=2, le=1000)
    repetition_min_tokens: int = Field(default=96, ge=2, le=1_000_000)
    reasoning_format: str = "prompted"
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=0.95, gt=0, le=1)
    budgets: dict[str, EffortBudget] = Field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    # Output tokens of a request that names no cap (a key's own default comes first); None:
    # the catalogue's 131,072. Per model: [routes."id"] default_max_output_tokens.
    default_max_output_tokens: int | None = Field(default=None, ge=1, le=1_048_576)

    public_docs: bool = False  # /docs and /openapi.json without a key
    # Prompt cache (docs/caching.md). Cached sequences resident at once, the tokens they may
    # hold (default: half of ctx_size), a factor on every TTL (tests shorten them), and named
    # groups of API keys that share one cache namespace (off by default: keys are isolated).
    cache_enabled: bool = True
    cache_entries: int = Field(default=16, ge=1, le=256)
    cache_max_tokens: int | None = Field(default=None, ge=0)
    cache_ttl_scale: float = Field(default=1.0, gt=0, le=100)
    cache_groups: dict[str, list[str]] = Field(default_factory=dict)

    # `serve --upstream URL` serves every model id from that one server.
    upstream: BaseURL | None = None
    upstream_dialect: Dialect = "openai"
    upstream_model: str | None = None
    upstream_api_key_env: str | None = None
    upstream_transport: Literal["auto", "httpx"] = "auto"
    # docs/web-search.md, docs/media.md.
    web_search_provider: Literal["none", "local", "searxng"] = "local"
    web_search_index: Path | None = None  # None: <data_dir>/search-index.sqlite3
    web_search_url: str | None = None  # the SearXNG instance, e.g. http://127.0.0.1:8888
    web_search_api_key: str | None = None  # sent as a Bearer token, for instances behind a proxy
    web_search_timeout_s: float = Field(default=10.0, gt=0, le=120)
    web_search_max_results: int = Field(default=5, ge=1, le=20)
    web_search_token_budget: int = Field(default=1200, ge=50, le=32768)
    web_search_max_calls: int = Field(default=2, ge=1, le=8)  # searches per Responses or Messages request
    media_allowed_hosts: list[str] = Field(default_factory=list)  # http(s) media URLs: none
    media_fetch_timeout_s: float = Field(default=10.0, gt=0, le=120)
    media_max_image_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    media_max_image_pixels: int = Field(default=25_000_000, ge=1)
    media_max_video_bytes: int = Field(default=50 * 1024 * 1024, ge=1024)
    media_max_video_seconds: float = Field(default=120.0, gt=0)
    media_max_parts: int = Field(default=16, ge=1, le=256)  # image and video parts per request
    mmproj: Path | None = None  # the embedded model's multimodal projector (GGUF): it sees images
    # Files (/v1/files, docs/files.md): where they are kept (None: <data_dir>/files), the most
    # one upload may bring, what one key may keep (count, bytes), what all keys together may keep;
    # extraction in a child process: text kept per file, PDF pages, wall-clock seconds (the CPU
    # limit too), address space, extractions at once per server process.
    files_dir: Path | None = None
    files_max_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    files_max_per_key: int = Field(default=1000, ge=1)
    files_max_bytes_per_key: int = Field(default=10 * 1024**3, ge=1024)
    files_max_total_bytes: int = Field(default=20 * 1024**3, ge=1024)
    files_max_chars: int = Field(default=1_000_000, ge=1000)
    files_max_pages: int = Field(default=2000, ge=1)
    files_extract_timeout_s: float = Field(default=30.0, gt=0, le=600)
    files_extract_memory_mb: int = Field(default=1024, ge=128)
    files_extract_concurrency: int = Field(default=2, ge=1, le=64)

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # a bounded, fair queue in front of each engine, bounded work per
    # request before the engine, and HTTP timeouts. See docs/configuration.md.
    queue_max: int = Field(default=64, ge=0)  # requests waiting for a slot, all keys together
    queue_max_per_key: int = Field(default=32, ge=0)  # waiting requests of one key (429 past it)
    queue_max_wait: float = Field(default=30.0, gt=0)  # seconds a request may wait, then 503
    max_messages: int | None = Field(default=None, ge=1)  # None: ctx_size // 4
    max_content_parts: int | None = Field(default=None, ge=1)  # None: ctx_size
    max_prompt_chars: int | None = Field(default=None, ge=1)  # None: 8 x ctx_size
    # The embedded engine: the most prompt tokens one request may bring, counted with the
    # model's tokenizer (0: the window only); the prompt tokens one llama.cpp call reads on an
    # idle engine (also llama.cpp's batch), and while other requests run (0: a prompt is read
    # in one go, as llama.cpp does). See docs/configuration.md.
    max_prompt_tokens: int = Field(default=8192, ge=0)
    prefill_turn: int = Field(default=64, ge=8, le=8192)
    prefill_turn_shared: int = Field(default=8, ge=0, le=8192)
    # A prompt read in turns beside other requests still goes at least 1/prefill_slowdown of the
    # speed its own turns show the engine reads it at, so it is read in a time proportional to
    # its length however busy the others keep the engine (1: no slower than alone).
    prefill_slowdown: float = Field(default=3.0, ge=1.0, le=100.0)
    # Prompted-reasoning attempts decoded at once on slots no other request is using (1: one
    # after another); with a seed too (a seeded answer then depends on the batches it shared).
    reasoning_together: int = Field(default=4, ge=1, le=16)
    reasoning_together_seeded: bool = False
    max_json_depth: int = Field(default=64, ge=8, le=512)  # nesting of any request body
    http_header_timeout: float = Field(default=10.0, gt=0)  # a request head must arrive within
    # Idle keep-alive connections close: longer than clients' own idle expiry (httpx: 5 s), so
    # that a client never reuses a connection the server is closing.
    http_keep_alive_timeout: int = Field(default=30, ge=1)
    # A stream waits this long for its first event before its headers go out (so an early refusal
    # is still a plain HTTP error); then it sends a keep-alive (an SSE comment, Messages' ping)
    # whenever nothing else was sent for stream_keep_alive seconds: a long prompt being read, a
    # reasoning phase whose text is not shown.
    stream_first_event_grace: float = Field(default=2.0, ge=0, le=60)
    stream_keep_alive: float = Field(default=10.0, gt=0, le=300)
    # Connection-level limits (docs/configuration.md): a slow body gets 408 and the connection
    # closes; past the caps a new connection gets 503. Unset caps follow the descriptor limit.
    http_body_timeout: float = Field(default=60.0, gt=0)  # seconds for a whole request body
    http_body_min_rate: int = Field(default=1024, ge=0)  # bytes/s a body must average; 0: off
    http_body_rate_grace: float = Field(default=5.0, ge=0)  # seconds before the rate applies
    http_max_connections: int | None = Field(default=None, ge=1)  # None: from RLIMIT_NOFILE
    http_max_connections_per_ip: int | None = Field(default=None, ge=0)  # None: total / 4; 0: off
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # An unknown KIMI_* variable stops every command, as an unknown TOML key does (else a warning).
    strict_settings: bool = False
    # Server processes on one port (serve --workers). None: one per core when every model is
    # relayed to upstreams; 1 with the embedded engine, whose model is loaded once.
    workers: int | None = Field(default=None, ge=1, le=256)
    # Seconds a worker has to start (import, build its app, open its socket) before it is
    # replaced, and to answer each health check once started.
    worker_start_timeout: float = Field(default=60.0, gt=0, le=3600)
    worker_health_timeout: float = Field(default=10.0, gt=0, le=600)
    engine_verbose: bool = False

    # stored keys, limits, quotas, usage ledger, metrics (docs/gateway.md).
    gateway_enabled: bool = True  # False: static keys only, no ledger, no limits (benchmarks)
    # None: SQLite at <data_dir>/kimi.db. Else a SQLAlchemy URL, e.g. postgresql://user@host/db.
    database_url: str | None = None
    redis_url: str | None = None  # shared rate limits across instances; None: in-process
    redis_prefix: str = "kimi:"
    admin_key: str | None = None  # enables /admin/v1/; None: the admin API is off
    # Throttled guessing (docs/gateway.md): failed authentications per client address, and per
    # key prefix over all addresses, before 429 (0: not counted); the seconds a full count
    # takes to drain; the longest wait a failure gets before the lock. Weak --api-key and
    # --admin-key values are refused on an address beyond loopback unless allowed.
    auth_max_failures: int = Field(default=20, ge=0)
    auth_max_prefix_failures: int = Field(default=100, ge=0)
    auth_failure_window: float = Field(default=600.0, gt=0, le=86_400)
    auth_max_delay: float = Field(default=2.0, ge=0, le=30)
    allow_weak_keys: bool = False
    # Where alerts go (signed with the secret; docs/gateway.md): a key's soft budget reached, its
    # budget spent, a key about to expire, an upstream's breaker opening.
    budget_webhook_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    budget_webhook_secret: str | None = Field(default=None, min_length=16)
    # A stored key expiring within this many days is told to the same webhook, once; 0: never.
    key_expiry_alert_days: float = Field(default=7.0, ge=0, le=365)
    metrics_public: bool = False  # /metrics without a key
    key_cache_seconds: float = Field(default=0.5, ge=0, le=1)  # revocation takes effect within this
    # Days a captured prompt and answer is kept (keys or teams with capture on; docs/gateway.md).
    capture_retention_days: int = Field(default=30, ge=1, le=3650)
    prices: dict[str, ModelPrice] = Field(default_factory=dict)  # model id -> USD per 1M tokens
    # Ids other clients ask for (exact, or patterns like "claude-*") -> a served id; on the
    # Messages door (policy/aliases.py). Setting the table replaces the default one.
    model_aliases: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_ALIASES))
    # SQLite in WAL mode: "normal" (SQLite's advice for WAL) keeps every committed row through
    # the server being killed, with no fsync on the request path; "full" also survives power
    # loss or an OS crash, at one fsync per batch of requests.
    sqlite_synchronous: Literal["full", "normal"] = "normal"
    ledger_batch_ms: float = Field(default=0.0, ge=0, le=1000)  # extra wait to gather a batch

    def upstream_key_variables(self) -> set[str]:
        """The environment variables named as upstream keys (they may start with KIMI_)."""
        names = {self.upstream_api_key_env} | {u.api_key_env for route in self.routes.values() for u in route.upstreams}
        return {name for name in names if name}

    @model_validator(mode="after")
    def _signed_webhook(self) -> Settings:
        if self.budget_webhook_url and not self.budget_webhook_secret:
            raise ValueError("budget_webhook_url needs budget_webhook_secret: every event is signed with it")
        return self

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
        # a level's cap may not
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
        config = _config_file.get() or os.environ.get("KIMI_CONFIG")
        if config:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config)))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Builds settings from flags (``overrides``, ``None`` meaning unset), env and a TOML file."""
    if config_file is not None:
        if not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {config_file}")
    else:
        named = os.environ.get("KIMI_CONFIG")
        config_file = Path(named) if named else None
        if config_file is not None and not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {named} (KIMI_CONFIG)")
    # Unknown settings stop start-up, before anything loads (kimi_server/unknown_settings.py).
    if config_file is not None:
        check_toml_file(config_file, Settings)
    given = {k: v for k, v in overrides.items() if v is not None and v != []}
    try:
        with _reading(config_file):
            settings = Settings(**given)
    except ValidationError as exc:
        # Named as the operator wrote it (--port, KIMI_PORT, the file's key), not as a field.
        raise explain_extras(exc, Settings) or explain_invalid(exc, given, os.environ, config_file) from None
    unknown = unknown_environment(os.environ, Settings, allowed=settings.upstream_key_variables())
    if unknown and settings.strict_settings:
        raise UnknownSettingError("\n".join(unknown) + "\n(strict_settings is on: unknown KIMI_* variables stop)")
    for line in unknown:  # another tool's variable, perhaps: said, not fatal
        log.warning("%s; ignored (strict_settings = true makes this an error)", line)
    check_price_models(settings)
    return settings


@contextmanager
def _reading(config_file: Path | None) -> Iterator[None]:
    token = _config_file.set(config_file)
    try:
        yield
    finally:
        _config_file.reset(token)
