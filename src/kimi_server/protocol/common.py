"""Wire pieces shared by both endpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class WireModel(BaseModel):
    """Strict types, unknown fields ignored (OpenAI clients send fields we do not use)."""

    model_config = ConfigDict(strict=True, extra="ignore")


class PromptCacheOptions(WireModel):
    mode: Literal["implicit"] = "implicit"
    ttl: Literal["5m", "1h"] = "5m"


class ErrorDetail(BaseModel):
    message: str
    type: str
    code: str | None = None
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class JSONSchemaFormat(WireModel):
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = True

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)
