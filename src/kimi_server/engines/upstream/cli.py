"""``kimi-server upstreams check``: probe every configured upstream once and report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

upstreams_app = typer.Typer(help="Upstream engines (routes to other servers).", no_args_is_help=True)
console = Console()


@upstreams_app.command("check")
def check(
    config: Annotated[Path | None, typer.Option(help="TOML settings file.")] = None,
    upstream: Annotated[str | None, typer.Option(help="Check this base URL instead of the routes.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Probes each upstream (GET {base_url}/models, with its key); exit status 1 if any fails."""
    from kimi_server.engines.upstream.build import single_upstream
    from kimi_server.engines.upstream.health import check_upstream
    from kimi_server.engines.upstream.relay import Upstream
    from kimi_server.settings import load_settings

    try:
        settings = load_settings(config, upstream=upstream)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    single = single_upstream(settings)
    targets: list[tuple[str, Any]] = (
        [("*", single)]
        if single is not None
        else [
            (mid, cfg)
            for mid, route in settings.routes.items()
            if route.engine == "upstream"
            for cfg in route.upstreams
        ]
    )
    if not targets:
        console.print("no upstreams configured (routes with engine = \"upstream\", or --upstream URL)")
        raise typer.Exit(2)

    async def run() -> list[dict[str, Any]]:
        ups = [Upstream(cfg) for _, cfg in targets]
        try:
            reports = await asyncio.gather(*(check_upstream(up) for up in ups))
        finally:
            for up in ups:
                await up.close()
        return [{"model": mid, **rep} for (mid, _), rep in zip(targets, reports, strict=True)]

    reports = asyncio.run(run())
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        for r in reports:
            mark = "[green]ok[/green]" if r["ok"] else "[red]FAIL[/red]"
            why = f"HTTP {r['status']}" if "status" in r else r.get("reason", "")
            console.print(f"{mark}  {r['model']}  {r['name']} ({r['dialect']})  {why}  {r['latency_ms']} ms")
    raise typer.Exit(0 if all(r["ok"] for r in reports) else 1)
