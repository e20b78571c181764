"""A setting with a bad value, named as the operator wrote it: the flag (``--port``), the
environment variable (``KIMI_PORT``) or the key in the TOML file, rather than pydantic's field
name (``port``), which is none of the three.

Values of settings that hold secrets (keys, passwords in a URL) are never repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

ENV_PREFIX = "KIMI_"
# Settings whose value may be a secret: a key, or a URL that may carry a password.
SECRET_WORDS = ("key", "secret", "password", "token", "database_url", "redis_url")
MAX_SHOWN = 60  # longer values are not repeated in full


class InvalidSettingError(ValueError):
    pass


def explain_invalid(
    error: ValidationError, flags: Mapping[str, Any], environ: Mapping[str, str], config_file: Path | None
) -> InvalidSettingError:
    """One line per bad value, each naming where that value was written."""
    env_names = {name.upper(): name for name in environ}
    lines = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        reason = str(item["msg"]).removeprefix("Value error, ")
        if not loc:  # a rule across several settings: its message names them
            lines.append(reason)
            continue
        where = _where(loc, flags, env_names, config_file)
        lines.append(f"{where}{_shown(loc, item.get('input'))}: {reason}")
    return InvalidSettingError("\n".join(lines))


def _where(loc: list[str], flags: Mapping[str, Any], env_names: Mapping[str, str], config_file: Path | None) -> str:
    field, inner = loc[0], ".".join(loc[1:])
    if field in flags:
        return flag_name(field)
    variable = env_names.get(ENV_PREFIX + field.upper())
    if variable is not None:
        return variable + (f" (at {inner})" if inner else "")
    dotted = ".".join(loc)
    return f"'{dotted}' in {config_file}" if config_file is not None else f"'{dotted}'"


def flag_name(field: str) -> str:
    """The ``serve`` flag that sets ``field`` (``api_keys`` is given one key at a time)."""
    return "--api-key" if field == "api_keys" else "--" + field.replace("_", "-")


def _shown(loc: list[str], value: Any) -> str:
    """`` = VALUE`` where the value is short, plain and no secret; else nothing."""
    if any(word in part.lower() for part in loc for word in SECRET_WORDS):
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return ""
    text = str(value)
    if len(text) > MAX_SHOWN or not text.isprintable():
        return ""
    return f" = {text!r}" if isinstance(value, str) else f" = {text}"
