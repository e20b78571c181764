"""``kimi-server upstreams check``: probe every configured upstream once and report: whether it
answers, takes the key, and lists the model this server will ask it for; each failure says what
to do in words."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

upstreams_app = typer.Typer(help="Upstream engines (routes to other servers).", no_args_is_help=True)
console = Console()


@upstreams_app.command("check")
def check(
    config: Annotated[Path | None, typer.Option(help="TOML settings file.")] = None,
    upstream: Annotated[str | None, typer.Option(help="Check this base URL instead of the routes.")] = None,
    upstream_model: Annotated[
        str | None,
        typer.Option(help="With --upstream: the upstream's model name.", show_default="the public model ids"),
    ] = None,
    upstream_dialect: Annotated[
        str | None,
        typer.Option(help="With --upstream: vllm, sglang, llamacpp, moonshot or openai.", show_default="openai"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    probe_calls: Annotated[
        bool,
        typer.Option(
            "--probe-calls",
            help='Also send one small call under tool_choice "required" (billed on a paid upstream): '
            "does the upstream keep it itself?",
        ),
    ] = False,
) -> None:
    """Probes each upstream (GET {base_url}/models, with its key) and checks it lists the model;
    says how each keeps forced tool calls; exit status 1 if any fails."""
    from kimi_server.engines.upstream.build import single_upstream
    from kimi_server.engines.upstream.health import advice
    from kimi_server.engines.upstream.relay import Upstream
    from kimi_server.policy.catalogue import CATALOGUE
    from kimi_server.settings import load_settings

    try:
        settings = load_settings(
            config, upstream=upstream, upstream_model=upstream_model, upstream_dialect=upstream_dialect
        )
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    single = single_upstream(settings)
    # (label, upstream, the public ids clients ask it for, where its model name is set)
    targets: list[tuple[str, Any, list[str], str]] = (
        [("*", single, [spec.id for spec in CATALOGUE], "--upstream-model (or KIMI_UPSTREAM_MODEL)")]
        if single is not None
        else [
            (mid, cfg, [mid], f'model = "..." in [[routes."{mid}".upstreams]]')
            for mid, route in settings.routes.items()
            if route.engine == "upstream"
            for cfg in route.upstreams
        ]
    )
    if not targets:
        console.print('no upstreams configured (routes with engine = "upstream", or --upstream URL)')
        raise typer.Exit(2)

    async def run() -> list[dict[str, Any]]:
        ups = [Upstream(cfg) for _, cfg, _, _ in targets]
        try:
            reports = await asyncio.gather(
                *(_checked(up, ids, probe_calls) for up, (_, _, ids, _) in zip(ups, targets, strict=True))
            )
        finally:
            for up in ups:
                await up.close()
        out = []
        for up, (mid, _, _, option), report in zip(ups, targets, reports, strict=True):
            if not report["ok"]:
                report["advice"] = advice(report, up, option)
            out.append({"model": mid, **report})
        return out

    reports = asyncio.run(run())
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        for r in reports:
            console.print(_line(r), soft_wrap=True, highlight=False)
    raise typer.Exit(0 if all(r["ok"] for r in reports) else 1)


async def _checked(up: Any, public_ids: list[str], probe_calls: bool) -> dict[str, Any]:
    from kimi_server.engines.upstream.health import check_upstream, first_served, upstream_names
    from kimi_server.engines.upstream.probe_calls import probe_required_call

    report = await check_upstream(up, public_ids)
    names = upstream_names(up, public_ids)
    if probe_calls and report["ok"] and names:
        model = first_served(names, report.get("served"))
        report["required_call"] = await probe_required_call(up, model, report)
    return report


# How each way of keeping a forced call reads in the report's line.
FORCED = {
    "native": "forced calls native (checked; a miss is asked again as JSON)",
    "json_schema": "forced calls as JSON Schema answers",
    "none": "forced calls refused (400)",
}
PROBED = {
    "honoured": "the upstream kept a required call itself",
    "ignored": "the upstream answered a required call with text",
    "failed": "the required-call probe failed",
}
COSTLY = (
    ': each forced call costs two; capabilities.forced_tool_calls = "json_schema" '
    "(llama.cpp's server: dialect llamacpp) asks that way at once"
)


def _probed(r: dict[str, Any]) -> str:
    outcome = r["required_call"]
    said = PROBED[outcome]
    if outcome == "ignored" and r["forced_tool_calls"] == "native":
        return f"[yellow]{escape(said + COSTLY)}[/yellow]"
    return escape(said)


def _line(r: dict[str, Any]) -> str:
    where = escape(f"{r['model']}  {r['name']} ({r['dialect']})")
    if not r["ok"]:
        return f"[red]FAIL[/red]  {where}: {escape(r['advice'])}"
    served = [m for m in r.get("upstream_models", []) if m not in r.get("not_served", ())]
    line = f"[green]ok[/green]    {where}  {r['latency_ms']} ms"
    if served:
        line += f"  serves {escape(', '.join(served))}"
    if r.get("not_served"):
        line += f"  (not listed: {escape(', '.join(r['not_served']))})"
    line += f"  {FORCED[r['forced_tool_calls']]}"
    if "required_call" in r:
        line += f"; {_probed(r)}"
    return line
