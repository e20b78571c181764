"""Contract profiles: which vendor's rules a server (or one route) follows, declared as data.

``evolink`` is the reference in ``shared/spec/`` (reasoning always on, Moonshot's extra fields
ignored). ``moonshot`` follows Moonshot's own Kimi API: its ``thinking`` switch turns reasoning
off, and kimi-k3's sampling parameters are fixed per mode (docs/contract.md, "Contract
profiles", says where each rule comes from). The rules in ``policy/rules.py`` consult these
objects; serving code never asks a profile's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Literal

from kimi_server.policy.catalogue import CATALOGUE

if TYPE_CHECKING:
    from kimi_server.settings import Settings

ContractName = Literal["evolink", "moonshot"]


class ThinkingField(Enum):
    """What a profile does with Moonshot's ``{"thinking": {"type": ...}}`` request field."""

    IGNORED = "ignored"  # accepted in any form, reasoning stays on (an unknown field)
    SWITCH = "switch"  # "enabled" / "disabled" switch reasoning; anything else is a 400


@dataclass(frozen=True)
class FixedSampling:
    """Values a model accepts for one reasoning mode; any other value is a 400."""

    temperature: float
    top_p: float = 0.95
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass(frozen=True)
class ContractProfile:
    name: ContractName
    thinking: ThinkingField
    # Models whose sampling parameters are all fixed, per mode: (thinking, non-thinking).
    # Models not named here follow the catalogue's own SamplingRule.
    fixed_sampling: Mapping[str, tuple[FixedSampling, FixedSampling]] = field(default_factory=dict)
    # Values the ``thinking.keep`` field may hold (Moonshot's "preserved thinking"); past
    # reasoning is rendered back either way, as under the reference.
    thinking_keep: tuple[str | None, ...] = (None,)
    # Tools declared in a system message ("dynamic tools", a Moonshot feature). Off, such a
    # message is a 400 rather than silently ignored.
    system_tools: bool = True
    # The longest function name accepted (request or system-message tools). Names are letters,
    # digits, '_' and '-', never starting with a digit, under every profile.
    tool_name_max: int = 64
    # Rules that only one vendor has are flags here, consulted by policy/rules.py, so serving
    # code never asks a profile's name.

    def sampling_for(self, model_id: str, *, reasoning: bool) -> FixedSampling | None:
        modes = self.fixed_sampling.get(model_id)
        if modes is None:
            return None
        return modes[0] if reasoning else modes[1]


# The reference has no dynamic tools, but it only adds: a Moonshot client's system-message tools
# are honoured rather than ignored (docs/contract.md). Names stay within the 64 characters that
# OpenAI-compatible clients and upstreams accept.
EVOLINK = ContractProfile(name="evolink", thinking=ThinkingField.IGNORED)

MOONSHOT = ContractProfile(
    name="moonshot",
    thinking=ThinkingField.SWITCH,
    # Moonshot's model parameter reference: temperature, top_p, n and both penalties cannot be
    # modified on its current K-series model; temperature is 1.0 when thinking, 0.6 when not.
    fixed_sampling={"kimi-k3": (FixedSampling(temperature=1.0), FixedSampling(temperature=0.6))},
    thinking_keep=(None, "all"),
    tool_name_max=256,
)

PROFILES: dict[ContractName, ContractProfile] = {p.name: p for p in (EVOLINK, MOONSHOT)}
DEFAULT_PROFILE = EVOLINK


def contract_for(settings: Settings, model_id: str) -> ContractProfile:
    """The model's route's contract, else the server's."""
    route = settings.routes.get(model_id)
    name = route.contract if route is not None and route.contract is not None else settings.contract
    return PROFILES[name]


def contracts(settings: Settings) -> dict[str, ContractProfile]:
    """Model id -> its profile, for every catalogue model."""
    return {spec.id: contract_for(settings, spec.id) for spec in CATALOGUE}
