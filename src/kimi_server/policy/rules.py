"""Applies a model's contract rules to request fields. Shared by every endpoint."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.policy.catalogue import KNOWN_EFFORTS, ModelSpec, SamplingRule, find_model
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile, ThinkingField


def resolve_model(model_id: str, served: frozenset[str] | None = None) -> ModelSpec:
    spec = find_model(model_id)
    if spec is None or (served is not None and model_id not in served):
        raise NotFoundError(
            f"The model '{model_id}' does not exist or you do not have access to it.",
            param="model",
        )
    return spec


def resolve_effort(spec: ModelSpec, effort: str | None, *, param: str) -> str:
    """Maps a requested effort (or its alias) to one of the model's levels."""
    if effort is None:
        return spec.default_effort
    if effort not in KNOWN_EFFORTS:
        raise InvalidRequestError(
            f"Invalid value for '{param}': '{effort}'. Expected one of {', '.join(KNOWN_EFFORTS)}.",
            param=param,
            code="invalid_value",
        )
    level = spec.effort_aliases.get(effort, effort)
    if level not in spec.efforts:
        allowed = ", ".join(f"'{e}'" for e in spec.efforts)
        raise InvalidRequestError(
            f"'{param}' = '{effort}' is not supported by {spec.id}; it accepts only {allowed}.",
            param=param,
            code="unsupported_value",
        )
    return level


SamplingField = Literal["temperature", "top_p", "presence_penalty", "frequency_penalty"]
SAMPLING_FIELDS: tuple[SamplingField, ...] = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def check_sampling(
    spec: ModelSpec,
    name: SamplingField,
    value: float | None,
    *,
    profile: ContractProfile = DEFAULT_PROFILE,
    reasoning: bool = True,
) -> None:
    """A profile that fixes the model's sampling accepts only its values for the mode; else
    K3.1 ignores temperature/top_p, kimi-k3 accepts only the catalogue's fixed values, and the
    penalties are ignored."""
    if value is None:
        return
    fixed_set = profile.sampling_for(spec.id, reasoning=reasoning)
    if fixed_set is None and name.endswith("_penalty"):
        return  # the reference lists them among the fields OpenAI clients send, ignored
    if not math.isfinite(value):
        raise InvalidRequestError(f"'{name}' must be a finite number.", param=name)
    if fixed_set is not None:
        fixed: float = getattr(fixed_set, name)
        mode = " with thinking enabled" if reasoning else " with thinking disabled"
    elif spec.sampling is SamplingRule.IGNORE:
        return
    else:
        fixed = spec.fixed_temperature if name == "temperature" else spec.fixed_top_p
        mode = ""
    if not math.isclose(value, fixed, rel_tol=0, abs_tol=1e-9):
        raise InvalidRequestError(
            f"'{name}' = {value} is not supported by {spec.id}{mode}: it is fixed at {fixed}; omit this field.",
            param=name,
            code="unsupported_value",
        )


def fixed_temperature(spec: ModelSpec, profile: ContractProfile, *, reasoning: bool) -> float:
    """The temperature the model runs at, as a Responses object repeats it."""
    fixed_set = profile.sampling_for(spec.id, reasoning=reasoning)
    return fixed_set.temperature if fixed_set is not None else spec.fixed_temperature


THINKING_TYPES = ("enabled", "disabled")


def _shown(value: object) -> str:
    """A client's value in an error message, cut short: it may be any JSON."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resolve_thinking(profile: ContractProfile, value: object, *, param: str = "thinking") -> bool:
    """Whether the request reasons. Under a profile that ignores the field, always (whatever it
    holds: the reference says reasoning is always on); else ``{"type": "enabled" | "disabled"}``
    with an optional ``keep``, and anything else is a 400 naming the part at fault. A missing
    (or null) ``type`` means enabled, the default: Moonshot's clients send ``{"keep": "all"}``
    or ``{}`` to mean thinking on."""
    if profile.thinking is ThinkingField.IGNORED or value is None:
        return True
    if not isinstance(value, dict):
        raise InvalidRequestError(f'\'{param}\' must be an object such as {{"type": "disabled"}}.', param=param)
    kind = value.get("type")
    if kind is None:
        kind = "enabled"
    if kind not in THINKING_TYPES:
        raise InvalidRequestError(
            f"Invalid value for '{param}.type': {_shown(kind)}. Expected 'enabled' or 'disabled'.",
            param=f"{param}.type",
            code="invalid_value",
        )
    keep = value.get("keep")
    if keep not in profile.thinking_keep:
        allowed = " or ".join("null" if k is None else repr(k) for k in profile.thinking_keep)
        raise InvalidRequestError(
            f"Invalid value for '{param}.keep': {_shown(keep)}. Expected {allowed}.",
            param=f"{param}.keep",
            code="invalid_value",
        )
    return bool(kind == "enabled")


def resolve_max_output(
    spec: ModelSpec,
    *,
    primary: int | None,
    primary_name: str,
    legacy: int | None = None,
    legacy_name: str | None = None,
    default: int | None = None,
) -> int:
    """The output cap (reasoning + answer). With both set, the primary wins over the deprecated
    alias: the reference only advises against sending both. ``default``: the cap when
    the request names none (policy/output_caps.py); else the catalogue's."""
    value = primary if primary is not None else legacy
    name = primary_name if primary is not None else (legacy_name or primary_name)
    if value is None:
        return default if default is not None else spec.default_max_output_tokens
    if value < 1 or value > spec.max_output_tokens:
        raise InvalidRequestError(
            f"'{name}' must be between 1 and {spec.max_output_tokens}; got {value}.",
            param=name,
        )
    return value


@dataclass(frozen=True)
class CacheOptions:
    mode: str = "implicit"
    ttl: str = "5m"

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode, "ttl": self.ttl}


def resolve_cache_options(
    spec: ModelSpec, requested: dict[str, object] | None, *, param: str = "prompt_cache_options"
) -> CacheOptions:
    """Omitted: an implicit 5m cache. kimi-k3 rejects the parameter outright."""
    if requested is None:
        return CacheOptions()
    if not spec.accepts_cache_options:
        raise InvalidRequestError(
            f"'{param}' is not supported by {spec.id}; it is available only for the K3.1 series.",
            param=param,
            code="unsupported_parameter",
        )
    mode = requested.get("mode", "implicit")
    ttl = requested.get("ttl", "5m")
    if mode != "implicit":
        raise InvalidRequestError(
            f"Invalid value for '{param}.mode': {mode!r}. Expected 'implicit'.", param=f"{param}.mode"
        )
    if ttl not in ("5m", "1h"):
        raise InvalidRequestError(
            f"Invalid value for '{param}.ttl': {ttl!r}. Expected '5m' or '1h'.", param=f"{param}.ttl"
        )
    return CacheOptions(mode="implicit", ttl=str(ttl))


def check_structured_output(spec: ModelSpec, kind: str, *, param: str) -> None:
    if kind != "text" and not spec.accepts_structured_output:
        raise InvalidRequestError(
            f"'{param}' of type '{kind}' is not supported by {spec.id}; structured output is "
            "available only for the K3.1 series.",
            param=param,
            code="unsupported_parameter",
        )


TOOL_NAME_CHARS = re.compile(r"[A-Za-z0-9_-]+")


def check_tool_name(profile: ContractProfile, name: str, *, param: str) -> None:
    """Letters, digits, '_' and '-', not starting with a digit, 1 to the profile's maximum
    characters. Every tool, declared in the request or in a system message, meets one rule."""
    limit = profile.tool_name_max
    if not name:
        raise InvalidRequestError(f"'{param}' must not be empty.", param=param, code="invalid_value")
    if len(name) > limit:
        raise InvalidRequestError(
            f"'{param}' is {len(name)} characters long; a tool name has at most {limit}.",
            param=param,
            code="invalid_value",
        )
    if not TOOL_NAME_CHARS.fullmatch(name):
        raise InvalidRequestError(
            f"Invalid '{param}' {_shown(name)}: use only letters, digits, '_' and '-'.",
            param=param,
            code="invalid_value",
        )
    if name[0] in "0123456789":
        raise InvalidRequestError(
            f"Invalid '{param}' {_shown(name)}: a tool name must not start with a digit.",
            param=param,
            code="invalid_value",
        )


def check_system_tools(profile: ContractProfile, *, param: str) -> None:
    """A system message's ``tools`` under a profile without dynamic tools: refused, never
    silently dropped (the model would not see them and the client would not know)."""
    if not profile.system_tools:
        raise InvalidRequestError(
            f"'{param}': tools declared in a system message are not supported by this server's "
            "contract; declare them in the request's 'tools'.",
            param=param,
            code="unsupported_parameter",
        )
