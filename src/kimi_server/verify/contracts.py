"""The rules a run expects, written from the contract documents rather than taken from this
server's own policy code: a conformance run that read the server's tables would only check the
server against itself.

``evolink`` is the reference (``shared/spec/``): reasoning always on, the model table below.
``moonshot`` is Moonshot's own Kimi API as docs/contract.md records it: the ``thinking`` switch,
``kimi-k3``'s sampling fixed per mode (penalties included), tool names up to 256 characters.
Both accept tools declared in system messages: the reference lacks them, but they only add
(docs/contract.md, "Tools declared in system messages").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ContractName = Literal["evolink", "moonshot"]

# The effort spellings the reference maps onto the K3.1 levels; "none" does not disable reasoning.
K31_ALIASES = ("medium", "xhigh", "minimal", "none")


@dataclass(frozen=True)
class ModelRules:
    """One row of the reference's model table."""

    id: str
    efforts: tuple[str, ...]
    aliases: tuple[str, ...]
    fixed_sampling: bool  # temperature / top_p: only the fixed values (else they are ignored)
    cache_options: bool  # prompt_cache_options accepted; writes reported apart
    structured_responses: bool  # Responses text.format json_schema


SPEC_MODELS: dict[str, ModelRules] = {
    "kimi-k3.1-pro": ModelRules("kimi-k3.1-pro", ("low", "high", "max"), K31_ALIASES, False, True, True),
    "kimi-k3.1-pro-highspeed": ModelRules(
        "kimi-k3.1-pro-highspeed", ("low", "high", "max"), K31_ALIASES, False, True, True
    ),
    "kimi-k3": ModelRules("kimi-k3", ("max",), (), True, False, False),
}

# A model id the tables do not know is held to the rules every model shares.
GENERIC = ModelRules("", ("max",), (), False, False, False)

FIXED_TEMPERATURE = 1.0
FIXED_TOP_P = 0.95


@dataclass(frozen=True)
class Contract:
    name: ContractName
    thinking_switch: bool  # {"thinking": {"type": "disabled"}} turns reasoning off
    fixed_penalties: bool  # presence / frequency penalties only 0 on fixed-sampling models
    non_thinking_temperature: float | None  # the fixed temperature with thinking disabled
    tool_name_max: int  # the longest tool name accepted
    thinking_keep: tuple[str, ...] = ()  # values of thinking.keep the switch accepts besides null


# Each field is a rule the two disagree on; the ``contract`` group probes every one of them both
# ways, so a run under the wrong contract fails whichever way round it is.
CONTRACTS: dict[ContractName, Contract] = {
    "evolink": Contract(
        "evolink", thinking_switch=False, fixed_penalties=False, non_thinking_temperature=None, tool_name_max=64
    ),
    "moonshot": Contract(
        "moonshot",
        thinking_switch=True,
        fixed_penalties=True,
        non_thinking_temperature=0.6,
        tool_name_max=256,
        thinking_keep=("all",),
    ),
}


def rules_for(model_id: str) -> ModelRules:
    return SPEC_MODELS.get(model_id, GENERIC)
