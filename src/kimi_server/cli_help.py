"""How ``--help`` shows options: a flag takes no value, so it shows no type; a repeatable
option shows the type of one value.

typer's rich help prints a type beside every option, flags included (``--json <bool>``), which
reads as if the flag wanted a value. Its plain help already leaves flags bare. Rather than
patching typer, each of this CLI's commands and groups is built from a class of its own that
gives such options a ``metavar`` (click's own field for what the help shows as the value), set
by ``plain_flags`` on an app once every command is registered.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

# ctx and the parameters are typer's own click types (typer bundles click): typed loosely here.


def _shown_value(param: Any, ctx: Any) -> None:
    """Gives a flag an empty metavar, and a repeatable option the type of one value."""
    if not isinstance(param, TyperOption) or param.metavar is not None:
        return
    if param.is_flag and not param.count:
        param.metavar = ""
        return
    shown = param.display_type_rich(ctx)
    if shown and shown.startswith("<list[") and shown.endswith("]>"):
        param.metavar = "<" + shown[len("<list[") : -len("]>")] + ">"


class PlainFlagsCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:
            _shown_value(param, ctx)
        return params


class PlainFlagsGroup(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:
            _shown_value(param, ctx)
        return params


def plain_flags(app: typer.Typer) -> typer.Typer:
    """Builds every command and group of ``app`` (sub-apps included) from the classes above,
    unless one names a class of its own. Call it after the last command is registered."""
    info: Any = app.info
    info.cls = info.cls or PlainFlagsGroup
    for command in app.registered_commands:
        if command.cls in (None, TyperCommand):  # typer's default
            command.cls = PlainFlagsCommand
    for group in app.registered_groups:
        group.cls = group.cls or PlainFlagsGroup
        if group.typer_instance is not None:
            plain_flags(group.typer_instance)
    return app
