"""Unknown settings: a mistyped key in the TOML file (at any depth) stops start-up, naming the
nearest valid key. A ``KIMI_*`` variable that names no setting is only warned about, with the
nearest setting, since the environment is shared with other tools that may use the prefix; with
``strict_settings`` it stops start-up too.

Pydantic-settings ignores environment variables that match no field, and a forbidden extra
key alone would not say what was meant, so both are checked here, before anything loads. So
are the model ids that prices and aliases name.
"""

from __future__ import annotations

import difflib
import tomllib
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from kimi_server.settings import Settings

ENV_PREFIX = "KIMI_"
# KIMI_* variables that are not settings: the config file's name, the test suite's switches, the chat client's.
NOT_SETTINGS = frozenset(
    {
        "KIMI_CONFIG",
        "KIMI_TEST_POSTGRES",
        "KIMI_TEST_REDIS",
        "KIMI_CORPUS_FULL",
        "KIMI_SKIP_PULL_TESTS",
        "KIMI_TEST_ENGINE",
        "KIMI_TEST_ENGINE_DELAY",
        "KIMI_TEST_ENGINE_TOKENS",
        "KIMI_API_KEY",
        "KIMI_OTHER_API_KEY",
        "KIMI_BASE_URL",
    }
)  # `kimi-server chat` and `verify`; not the server


class UnknownSettingError(ValueError):
    pass


def check_toml_file(path: Path, model: type[BaseModel]) -> None:
    with path.open("rb") as f:
        data = tomllib.load(f)
    problems = list(unknown_keys(data, model))
    if problems:
        raise UnknownSettingError("\n".join(f"{p} (in {path})" for p in problems))


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel], where: str = "") -> Iterable[str]:
    """A line for each key of ``data`` (and of the tables inside it) that ``model`` lacks."""
    fields = model.model_fields
    for key, value in data.items():
        path = f"{where}{key}"
        if key not in fields:
            yield f"unknown setting '{path}'{_nearest(key, fields)}"
            continue
        nested, shape = _nested_model(fields[key].annotation)
        if nested is not None:
            yield from _unknown_nested_keys(value, nested, shape, path)


def _unknown_nested_keys(value: Any, nested: type[BaseModel], shape: str, path: str) -> Iterable[str]:
    """``unknown_keys`` of the tables in ``value``, a field holding ``nested`` as ``shape``
    (see ``_nested_model``); a value of the wrong type is left to validation."""
    if shape == "one" and isinstance(value, Mapping):
        yield from unknown_keys(value, nested, f"{path}.")
    elif shape == "dict" and isinstance(value, Mapping):
        for name, item in value.items():
            if isinstance(item, Mapping):
                yield from unknown_keys(item, nested, f"{path}.{name}.")
    elif shape == "list" and isinstance(value, list):
        for n, item in enumerate(value):
            if isinstance(item, Mapping):
                yield from unknown_keys(item, nested, f"{path}[{n}].")


def explain_extras(error: ValidationError, model: type[BaseModel]) -> UnknownSettingError | None:
    """Pydantic's "extra inputs are not permitted" (from a JSON value in the environment, say)
    as the same message, with the nearest valid key; None when no error is of that kind."""
    problems = []
    for item in error.errors():
        if item["type"] != "extra_forbidden":
            continue
        loc = [str(seg) for seg in item["loc"]]
        holder: type[BaseModel] | None = model
        segs = iter(loc[:-1])
        for seg in segs:
            field = holder.model_fields.get(seg) if holder is not None else None
            holder, shape = _nested_model(field.annotation) if field is not None else (None, "")
            if shape in ("dict", "list"):
                next(segs, None)  # the entry's key or index
        valid = holder.model_fields if holder is not None else {}
        problems.append(f"unknown setting '{'.'.join(loc)}'{_nearest(loc[-1], valid)}")
    return UnknownSettingError("\n".join(problems)) if problems else None


def unknown_environment(environ: Mapping[str, str], model: type[BaseModel], allowed: Iterable[str] = ()) -> list[str]:
    """A line for each ``KIMI_*`` variable that names no setting (case-insensitively, as
    pydantic reads them), is not one of ``NOT_SETTINGS`` and not in ``allowed`` (an upstream's
    key named by ``api_key_env``)."""
    fields = model.model_fields
    known = NOT_SETTINGS | {name.upper() for name in allowed}
    valid = sorted({ENV_PREFIX + name.upper() for name in fields} | NOT_SETTINGS)
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper[len(ENV_PREFIX) :].lower() in fields:
            continue
        problems.append(f"unknown environment variable {name}: it names no setting{_nearest(upper, valid)}")
    return problems


def _nearest(name: str, valid: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field holds: itself ("one"), as dict values ("dict") or list items ("list")."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            found = _nested_model(arg)
            if found[0] is not None:
                return found
        return None, ""
    if origin is dict:
        inner = get_args(annotation)[1]
        return (inner, "dict") if _is_model(inner) else (None, "")
    if origin is list:
        inner = get_args(annotation)[0]
        return (inner, "list") if _is_model(inner) else (None, "")
    return (annotation, "one") if _is_model(annotation) else (None, "")


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def check_price_models(settings: Settings) -> None:
    """A price under a mistyped id would leave the real model unpriced and its budgets silently
    free: each price must name a model this server can serve."""
    from kimi_server.policy.catalogue import CATALOGUE

    served = sorted({spec.id for spec in CATALOGUE} | set(settings.routes))
    named = [("prices", name) for name in settings.prices]
    named += [(f"model_aliases.{alias}", target) for alias, target in settings.model_aliases.items()]
    for where, name in named:
        if name not in served:
            close = difflib.get_close_matches(name, served, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'?" if close else f"the models are {', '.join(served)}"
            raise UnknownSettingError(f"{where}: '{name}' is not a model this server serves; {hint}")
