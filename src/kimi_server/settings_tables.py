"""The nested tables of the settings (``[budgets.*]``, ``[prices.*]``, ``[routes.*]`` and their
upstreams): each a strict model, so a mistyped key is an error rather than a default."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kimi_server.policy.profiles import ContractName


class EffortBudget(BaseModel):
    """Reasoning tokens for one effort level: at least ``floor``, at most ``cap``."""

    model_config = ConfigDict(extra="forbid")  # a mistyped key is an error, not a default

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
    "low": EffortBudget(floor=64, cap=96),
    "high": EffortBudget(floor=96, cap=128),
    "max": EffortBudget(floor=128, cap=256),
}
EFFORT_ORDER = ("low", "high", "max")


class ModelPrice(BaseModel):
    """USD per million tokens of each class, and per web-search call."""

    model_config = ConfigDict(extra="forbid")

    input: Decimal = Decimal(0)
    cache_read: Decimal = Decimal(0)
    cache_write_5m: Decimal = Decimal(0)
    cache_write_1h: Decimal = Decimal(0)
    output: Decimal = Decimal(0)
    web_search: Decimal = Decimal(0)  # USD per call

    @model_validator(mode="after")
    def _exact(self) -> ModelPrice:
        # Costs are integer nano-dollars: exact when a per-million price has <= 3 decimals.
        for name, value in self:
            places = 9 if name == "web_search" else 3
            if value < 0 or -int(value.as_tuple().exponent) > places:
                raise ValueError(f"price '{name}' must be >= 0 with at most {places} decimal places")
        return self


# routes to other OpenAI-compatible servers; see docs/configuration.md.
Dialect = Literal["vllm", "sglang", "llamacpp", "moonshot", "openai"]


def check_base_url(url: str) -> str:
    """An upstream's base URL must say http:// or https:// and name a host: ``127.0.0.1:8164``
    alone would fail every call as if the server there were down."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        hint = url if "://" in url else f"http://{url.rstrip('/')}/v1"
        raise ValueError(f"an upstream base URL needs http:// or https:// and a host, e.g. {hint}")
    return url


BaseURL = Annotated[str, AfterValidator(check_base_url)]


class UpstreamCapabilities(BaseModel):
    """What the upstream can do; a request needing more gets a 400 before it leaves."""

    model_config = ConfigDict(extra="forbid")

    tools: bool = True
    json_schema: bool = True
    vision: bool = False
    reasoning: bool = True  # returns reasoning separately (or in <think> tags) by itself
    prompt_cache: bool = False  # reports cached prompt tokens of its own
    # How a tool_choice of "required" or a named function is kept: the upstream constrains
    # calls itself ("native"), a JSON-Schema answer read back as the call ("json_schema"), or
    # not at all ("none": such a request → 400). None: the dialect's own.
    forced_tool_calls: Literal["native", "json_schema", "none"] | None = None


class UpstreamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: BaseURL  # up to and including /v1
    name: str | None = None  # for logs and health; default: the base URL's host
    api_key_env: str | None = None  # the environment variable holding the upstream's key
    model: str | None = None  # the upstream's model name; default: the public model id
    dialect: Dialect = "openai"
    capabilities: UpstreamCapabilities = Field(default_factory=UpstreamCapabilities)
    weight: int = Field(default=1, ge=1, le=1000)
    max_output_tokens: int | None = Field(default=None, ge=1)  # the upstream's own cap
    context_length: int | None = Field(default=None, ge=1)  # its window, shown by /v1/models
    # Requests it serves at once; more wait in kimi-server's fair queue.
    max_concurrency: int = Field(default=64, ge=1, le=100_000)
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=60.0, gt=0)  # longest silence, before or within a stream
    total_timeout: float = Field(default=1800.0, gt=0)
    retries: int = Field(default=2, ge=0, le=10)  # per upstream, only before any output
    backoff: float = Field(default=0.25, ge=0)  # first retry delay, doubling
    max_retry_after: float = Field(default=10.0, ge=0)  # longest Retry-After honoured
    breaker_threshold: int = Field(default=5, ge=1)
    breaker_cooldown: float = Field(default=30.0, gt=0)
    max_connections: int = Field(default=256, ge=1)
    # The relayed call's HTTP client: "auto" is kimi-server's own (httpx behind a proxy).
    transport: Literal["auto", "httpx"] = "auto"


class ModelRoute(BaseModel):
    """What one catalogue model id runs on. Unset fields fall back to the top-level ones."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["embedded", "upstream"] = "embedded"
    model: str | None = None
    upstreams: list[UpstreamConfig] = Field(default_factory=list)  # tried in weighted order
    # Output tokens of a request that names no cap; None: the top-level setting.
    default_max_output_tokens: int | None = Field(default=None, ge=1, le=1_048_576)
    # Whose API rules this model id follows (policy/profiles.py); None: the top-level setting.
    contract: ContractName | None = None

    @model_validator(mode="after")
    def _upstreams_given(self) -> ModelRoute:
        if self.engine == "upstream" and not self.upstreams:
            raise ValueError("a route with engine 'upstream' needs at least one entry in 'upstreams'")
        return self
