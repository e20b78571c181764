"""Model aliases: the ids other clients ask for by default (Claude Code asks for its own models)
mapped onto the ids this server serves. An alias is an exact id or a shell-style pattern
(``claude-*``); an exact alias wins, then the first pattern that matches, in the order given."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

# Claude Code asks for a Haiku model for its quick side tasks and another Claude model for the
# rest: the quick one goes to the fast variant.
DEFAULT_ALIASES: dict[str, str] = {"claude-*haiku*": "kimi-k3.1-pro-highspeed", "claude-*": "kimi-k3.1-pro"}


def resolve_alias(model: str, aliases: Mapping[str, str]) -> str:
    """The id ``model`` stands for; itself when no alias names it."""
    target = aliases.get(model)
    if target is not None:
        return target
    for pattern, target in aliases.items():
        if any(c in pattern for c in "*?[") and fnmatchcase(model, pattern):
            return target
    return model
