"""What every console page shares: the templates, form bodies, and the answers for a visitor
who is not signed in or not allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from kimi_server import __version__
from kimi_server.console.charts import budget_meter
from kimi_server.console.session import AdminOnly, NotSignedIn, Viewer
from kimi_server.errors import APIError

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["version"] = __version__
templates.env.globals["budget_meter"] = budget_meter


NOTHING = "\u2013"  # an en dash: "not set"


def shown(value: Any) -> str:
    """A field of the admin API or ``/v1/key/info`` as a page shows it."""
    if value is None:
        return NOTHING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(shown(v) for v in value) or NOTHING
    if isinstance(value, dict):
        return "; ".join(f"{k.replace('_', ' ')}: {shown(v)}" for k, v in value.items())
    return str(value)


templates.env.filters["shown"] = shown
MAX_FORM_BYTES = 64 * 1024  # a key's form is small; more is not a form of this console

Form = dict[str, list[str]]


def page(request: Request, name: str, who: Viewer | None, status: int = 200, **context: Any) -> Response:
    # No page of the console may be kept by a shared cache: each is one viewer's. The security
    # headers come with every console answer (console/headers.py).
    headers = {"cache-control": "no-store"}
    return templates.TemplateResponse(request, name, {"who": who, **context}, status_code=status, headers=headers)


async def read_form(request: Request) -> Form:
    """A url-encoded form body (what the console's forms send)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)


def one(form: Form, name: str) -> str:
    values = form.get(name)
    return values[0].strip() if values else ""


def error_text(exc: APIError) -> str:
    """An API error as the console shows it: its message, naming the field."""
    return exc.message if not exc.param else f"{exc.message} (field: {exc.param})"


async def not_signed_in(request: Request, _: Exception) -> Response:
    if request.headers.get("hx-request"):  # a polled fragment: send the whole page to sign-in
        return Response(status_code=204, headers={"hx-redirect": "/console/login"})
    return RedirectResponse("/console/login", status_code=303)


async def admin_only(request: Request, _: Exception) -> Response:
    return page(request, "denied.html", None, status=403)


HANDLERS: dict[type[Exception], Any] = {NotSignedIn: not_signed_in, AdminOnly: admin_only}
