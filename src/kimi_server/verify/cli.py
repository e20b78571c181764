"""``kimi-server verify URL``: the command line over the runner."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from kimi_server.verify.contracts import CONTRACTS, SPEC_MODELS
from kimi_server.verify.registry import GROUPS

if TYPE_CHECKING:
    from kimi_server.verify.target import Target


def verify(
    url: Annotated[str, typer.Argument(help="The endpoint's base URL, e.g. http://127.0.0.1:8000/v1.")],
    key: Annotated[str, typer.Option(help="API key.", envvar="KIMI_API_KEY", show_default="$KIMI_API_KEY")] = "",
    other_key: Annotated[
        str,
        typer.Option(
            help="A second API key: checks that it cannot see the first key's files.",
            envvar="KIMI_OTHER_API_KEY",
            show_default="$KIMI_OTHER_API_KEY",
        ),
    ] = "",
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model id to test; repeat for several (the first is used by most groups).",
            show_default="the Kimi ids the endpoint lists",
        ),
    ] = None,
    contract: Annotated[str, typer.Option(help="Whose rules to hold it to: evolink or moonshot.")] = "evolink",
    only: Annotated[
        list[str] | None, typer.Option(help=f"Run only this group; repeat. Groups: {', '.join(GROUPS)}.")
    ] = None,
    skip: Annotated[list[str] | None, typer.Option(help="Leave this group out; repeat.")] = None,
    timeout: Annotated[
        float,
        typer.Option(min=0.01, help="Seconds any one request may take, first byte to last (a wall-clock deadline)."),
    ] = 120.0,
    check_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.01, help="Seconds any one check may take, all its requests together.", show_default="3 x --timeout"
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=32, help="Checks in flight at once.")] = 4,
    anthropic_url: Annotated[
        str,
        typer.Option(
            help="The Messages API's base, as ANTHROPIC_BASE_URL (e.g. http://host:8000/anthropic).",
            show_default="the URL's host: …/v1/messages",
        ),
    ] = "",
    body_limit: Annotated[
        int, typer.Option(min=0, help="The endpoint's request-body limit in bytes, to check its 413 (0: not known).")
    ] = 0,
    limited_key: Annotated[
        str, typer.Option(help="A key the endpoint rate-limits (a low requests-per-minute), to check its 429.")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Checks an endpoint against the Kimi contract; exit status 1 if any check fails."""
    from kimi_server.verify.runner import run, select
    from kimi_server.verify.target import Target

    err = Console(stderr=True)
    unknown = [g for g in (only or []) + (skip or []) if g not in GROUPS]
    if contract not in CONTRACTS or unknown:
        what = f"unknown group {unknown[0]!r}" if unknown else f"unknown contract {contract!r}"
        err.print(f"[red]error:[/red] {escape(what)} (groups: {', '.join(GROUPS)}; contracts: evolink, moonshot)")
        raise typer.Exit(2)
    target = Target(
        url,
        key,
        model or [],
        CONTRACTS[contract],
        timeout=timeout,
        check_timeout=check_timeout or 0.0,
        other_key=other_key or None,
        anthropic_url=anthropic_url,
        body_limit=body_limit,
        limited_key=limited_key,
    )
    try:
        if not target.models:
            target.models = _listed_models(target, err)
        checks = select(only or [], skip or [])
        started = time.monotonic()
        with err.status("verifying…") as status:
            results = run(target, checks, lambda r: status.update(f"{r.group}: {r.check}"), concurrency=concurrency)
        seconds = time.monotonic() - started
    finally:
        target.close()
    header = (
        f"{target.base_url}  contract {contract}  models {', '.join(target.models)}  "
        f"deadlines: request {target.timeout:g} s, check {target.check_timeout:g} s"
    )
    if as_json:
        from kimi_server.verify.report import as_json as render

        meta: dict[str, object] = {
            "url": target.base_url,
            "contract": contract,
            "models": target.models,
            "deadlines": {"request": target.timeout, "check": target.check_timeout},
        }
        print(render(results, meta, seconds))
    else:
        from kimi_server.verify.report import print_table

        # Off a terminal (a CI log, a pipe) rich would fold the table to 80 columns.
        print_table(results, header, seconds, Console(width=None if sys.stdout.isatty() else 160))
    if any(r.status.value == "FAIL" for r in results):
        raise typer.Exit(1)


def _listed_models(target: Target, err: Console) -> list[str]:
    """The Kimi ids the endpoint's ``GET /models`` lists, in the contract's table order."""
    import httpx

    from kimi_server.verify.target import error_text

    try:
        resp = target.http.get(target.base_url + "/models", headers={"Authorization": f"Bearer {target.key}"})
    except httpx.HTTPError as exc:
        err.print(f"[red]error:[/red] cannot reach {escape(target.base_url)}: {escape(str(exc))}")
        raise typer.Exit(2) from None
    if resp.status_code != 200:
        err.print(
            f"[red]error:[/red] GET /models: HTTP {resp.status_code}: {escape(error_text(resp))}; "
            "check --key, or name the models with --model"
        )
        raise typer.Exit(2)
    listed = {m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict)}
    ids = [m for m in SPEC_MODELS if m in listed]
    if not ids:
        err.print(
            f"[red]error:[/red] the endpoint lists no Kimi model id ({', '.join(SPEC_MODELS)}); "
            "name the models to test with --model"
        )
        raise typer.Exit(2)
    return ids
