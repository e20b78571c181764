"""How ``--help`` shows options: a flag takes no value, so it shows no type; a repeatable
option shows the type of one value.

typer's rich help prints a type beside every option, flags included (``--json <bool>``), which
reads as if the flag wanted a value. Its plain help already leaves flags bare; this makes the
rich one agree. Imported once by the ``kimi-server`` command.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

_typed = TyperOption.display_type_rich


def _display_type(self: TyperOption, ctx: Any) -> str | None:  # ctx: typer's own click.Context
    if self.is_flag and not self.count:
        return None
    shown = _typed(self, ctx)
    # A repeatable option takes one value each time: <str>, not <list[str]>.
    if shown and shown.startswith("<list[") and shown.endswith("]>"):
        return "<" + shown[len("<list[") : -len("]>")] + ">"
    return shown


TyperOption.display_type_rich = _display_type  # type: ignore[method-assign]
