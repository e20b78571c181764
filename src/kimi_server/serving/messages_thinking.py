"""Messages ``thinking``, ``output_config.effort`` and the ``clear_thinking`` edit: the effort
level a request runs at, whether it reasons (the profile's thinking switch, as on chat), whether
its thinking text is shown, and which turns keep their reasoning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimi_server.errors import InvalidRequestError
from kimi_server.policy import rules
from kimi_server.policy.catalogue import K31_ALIASES as ALIASES
from kimi_server.policy.catalogue import ModelSpec
from kimi_server.policy.profiles import ContractProfile
from kimi_server.protocol.messages import CountTokensRequest, ThinkingDisabled, ThinkingEnabled
from kimi_server.settings_tables import EFFORT_ORDER

MIN_THINKING_BUDGET = 1024  # Anthropic's own floor for thinking.budget_tokens


def level_for_budget(spec: ModelSpec, budgets: Mapping[str, Any], budget_tokens: int) -> str:
    """The lowest of the model's effort levels whose reasoning cap covers ``budget_tokens``;
    the highest when none does."""
    for level in spec.efforts:
        if budgets[level].cap >= budget_tokens:
            return level
    return spec.efforts[-1]


def effort_level(spec: ModelSpec, body: CountTokensRequest, budgets: Mapping[str, Any], max_tokens: int | None) -> str:
    """``output_config.effort`` when given, else ``thinking.budget_tokens`` mapped onto the
    levels, else the model's default (``adaptive``, or no ``thinking``)."""
    thinking = body.thinking
    if isinstance(thinking, ThinkingEnabled):
        if thinking.budget_tokens < MIN_THINKING_BUDGET:
            raise InvalidRequestError(
                f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}; got {thinking.budget_tokens}.",
                param="thinking.budget_tokens",
            )
        if max_tokens is not None and thinking.budget_tokens >= max_tokens:
            raise InvalidRequestError(
                f"'thinking.budget_tokens' ({thinking.budget_tokens}) must be less than 'max_tokens' ({max_tokens}).",
                param="thinking.budget_tokens",
            )
    effort = body.output_config.effort if body.output_config else None
    if effort is not None:
        return _nearest_level(spec, effort)
    if isinstance(thinking, ThinkingEnabled):
        return level_for_budget(spec, budgets, thinking.budget_tokens)
    return spec.default_effort


def reasoning_and_display(profile: ContractProfile, body: CountTokensRequest) -> tuple[bool, bool]:
    """Whether the request reasons (``disabled`` is the profile's thinking switch, as on chat),
    and whether its thinking text is shown."""
    thinking = body.thinking
    if thinking is None:
        return rules.resolve_thinking(profile, None), True
    switch = "disabled" if isinstance(thinking, ThinkingDisabled) else "enabled"
    reasoning = rules.resolve_thinking(profile, {"type": switch})
    return reasoning, getattr(thinking, "display", None) != "omitted"


def keep_thinking_from(body: CountTokensRequest) -> int:
    """The wire index of the first message whose thinking stays in the conversation, under the
    ``clear_thinking`` edits (0: all of it). Other edits would clear content this server keeps:
    refused rather than ignored."""
    edits = body.context_management.edits if body.context_management else None
    assistant = [i for i, m in enumerate(body.messages) if m.role == "assistant"]
    start = 0
    for i, edit in enumerate(edits or ()):
        where = f"context_management.edits[{i}]"
        if edit.type != "clear_thinking_20251015":
            raise InvalidRequestError(
                f"'{where}' is a {str(edit.type)[:60]!r} edit, which this server does not apply; only "
                "'clear_thinking_20251015' is supported.",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        turns = _kept_turns(getattr(edit, "keep", None), f"{where}.keep")
        if turns is None or turns >= len(assistant):
            continue
        # the first kept turn, or past the end when none is kept
        start = max(start, assistant[-turns] if turns else len(body.messages))
    return start


def _kept_turns(keep: object, where: str) -> int | None:
    """Assistant turns whose thinking is kept; None: all. Anthropic's default keeps one."""
    if keep is None:
        return 1
    if keep == "all" or keep == {"type": "all"}:
        return None
    if isinstance(keep, dict) and keep.get("type") == "thinking_turns":
        value = keep.get("value")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise InvalidRequestError(
            f"'{where}.value' must be a whole number of turns, 0 or more.", param=f"{where}.value"
        )
    raise InvalidRequestError(
        f"Invalid value for '{where}': expected 'all', {{\"type\": \"all\"}} or "
        '{"type": "thinking_turns", "value": N}.',
        param=where,
        code="invalid_value",
    )


def _nearest_level(spec: ModelSpec, effort: str) -> str:
    """``output_config.effort`` onto the model's levels. Claude Code sets it by itself, turn by
    turn, so a level the model lacks (``kimi-k3`` runs at ``max`` only) is the nearest it has,
    not a 400 the user cannot act on; an unknown value is still a 400."""
    try:
        return rules.resolve_effort(spec, effort, param="output_config.effort")
    except InvalidRequestError as exc:
        if exc.code != "unsupported_value":
            raise
    wanted = EFFORT_ORDER.index(spec.effort_aliases.get(effort, ALIASES.get(effort, effort)))
    return min(spec.efforts, key=lambda level: (abs(EFFORT_ORDER.index(level) - wanted), -EFFORT_ORDER.index(level)))
