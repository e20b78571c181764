"""The Kimi model catalogue: what each public model id allows, declared as data.

Which engine and weights serve each id is configuration (``Settings.models``); the rules here are
the API contract and do not change with the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum


class SamplingRule(Enum):
    """How a model treats client-supplied ``temperature`` / ``top_p``."""

    IGNORE = "ignore"  # accepted, then ignored (the K3.1 pair)
    FIXED = "fixed"  # only the fixed value is accepted; anything else is a 400 (kimi-k3)


@dataclass(frozen=True)
class ModelSpec:
    id: str
    efforts: tuple[str, ...]
    default_effort: str
    sampling: SamplingRule
    accepts_cache_options: bool
    accepts_structured_output: bool
    separates_cache_writes: bool
    context_window: int = 1_048_576
    default_max_output_tokens: int = 131_072
    max_output_tokens: int = 1_048_576
    fixed_temperature: float = 1.0
    fixed_top_p: float = 0.95
    owned_by: str = "moonshotai"
    created: int = 1_767_225_600
    effort_aliases: dict[str, str] = field(default_factory=dict)


# Generic client effort names mapped onto the K3.1 levels; "none" does not disable reasoning.
K31_ALIASES = {"medium": "high", "xhigh": "max", "minimal": "low", "none": "low"}

K31_PRO = ModelSpec(
    id="kimi-k3.1-pro",
    efforts=("low", "high", "max"),
    default_effort="max",
    sampling=SamplingRule.IGNORE,
    accepts_cache_options=True,
    accepts_structured_output=True,
    separates_cache_writes=True,
    effort_aliases=K31_ALIASES,
)

CATALOGUE: tuple[ModelSpec, ...] = (
    K31_PRO,
    # Same parameters as Pro; only its generation speed differs upstream.
    replace(K31_PRO, id="kimi-k3.1-pro-highspeed"),
    ModelSpec(
        id="kimi-k3",
        efforts=("max",),
        default_effort="max",
        sampling=SamplingRule.FIXED,
        accepts_cache_options=False,
        accepts_structured_output=False,
        separates_cache_writes=False,
    ),
)

# Every effort spelling the API's schema admits; anything else is malformed rather than unsupported.
KNOWN_EFFORTS = ("low", "high", "max", "medium", "xhigh", "minimal", "none")


def find_model(model_id: str) -> ModelSpec | None:
    for spec in CATALOGUE:
        if spec.id == model_id:
            return spec
    return None
