"""The ``kimi-server`` command: ``serve`` and ``models pull|list``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn
from rich.console import Console
from rich.markup import escape

from kimi_server import __version__, log_json
from kimi_server.chat_cli.command import chat as chat_command
from kimi_server.cli_help import plain_flags
from kimi_server.gate.audit_cli import audit as audit_command
from kimi_server.gate.cli import keys_app
from kimi_server.gate.requests_cli import requests as requests_command
from kimi_server.gate.teams_cli import teams_app
from kimi_server.gate.usage_cli import usage as usage_command
from kimi_server.models.cli import models_app
from kimi_server.search.cli import search_app
from kimi_server.settings import Settings
from kimi_server.verify.cli import verify as verify_command

app = typer.Typer(name="kimi-server", help="A self-hosted server for the Kimi API.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(keys_app, name="keys")
app.add_typer(teams_app, name="teams")
app.command("usage")(usage_command)
app.command("requests")(requests_command)
app.command("audit")(audit_command)
app.command("chat")(chat_command)
from kimi_server.engines.upstream.cli import upstreams_app  # noqa: E402

app.add_typer(upstreams_app, name="upstreams")
app.add_typer(search_app, name="search")
app.command("verify")(verify_command)
console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        print(f"kimi-server {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """A self-hosted server for the Kimi API."""


# --help shows the defaults that apply when a flag is
# absent (flags default to None so that env and TOML can still supply the value).
def _default(name: str) -> str:
    from kimi_server.settings import Settings

    return str(Settings.model_fields[name].default)


def start_lines(settings: Settings, served: list[str], dev_key: str | None) -> list[str]:
    """What ``serve`` prints before it starts listening."""
    origin = f"http://{settings.host}:{settings.port}"
    lines = [f"kimi-server: serving {', '.join(sorted(served))}", f"  base URL: {origin}/v1"]
    # Whose API rules apply (policy/profiles.py), with the routes that follow other ones.
    others = [
        f"{model_id}: {route.contract}"
        for model_id, route in sorted(settings.routes.items())
        if route.contract is not None and route.contract != settings.contract and model_id in served
    ]
    lines.append(f"  contract: {settings.contract}" + (f" ({', '.join(others)})" if others else ""))
    if dev_key:
        lines.append(f"  development API key: {dev_key}")
    # The page asks for the key unless the document is public (public_docs).
    lines.append(f"  docs: {origin}/docs" + ("" if settings.public_docs else " (asks for the API key)"))
    return lines


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind.", show_default=_default("host"))] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind.", show_default=_default("port"))] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Catalogue model name, path to a GGUF, or hf:ORG/REPO/FILE.gguf.", show_default=_default("model")
        ),
    ] = None,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            "--api-key",
            help="An accepted API key; repeat for several.",
            show_default="none: a development key is made, kept in the data dir and printed",
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="TOML settings file.", show_default="$KIMI_CONFIG")] = None,
    ctx_size: Annotated[
        int | None, typer.Option(help="Context tokens shared by all slots.", show_default=_default("ctx_size"))
    ] = None,
    parallel: Annotated[
        int | None, typer.Option(help="Concurrent generation slots.", show_default=_default("parallel"))
    ] = None,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads (0: one per core).", show_default=_default("threads"))
    ] = None,
    models_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where pulled models are kept.",
            show_default="$KIMI_MODELS_DIR, else $XDG_CACHE_HOME/kimi-server/models, else ~/.cache/kimi-server/models",
        ),
    ] = None,
    admin_key: Annotated[
        str | None, typer.Option("--admin-key", help="Enables the admin API (/admin/v1/) with this key.")
    ] = None,
    upstream: Annotated[
        str | None, typer.Option(help="Serve every model id from this OpenAI-compatible base URL (…/v1).")
    ] = None,
    upstream_dialect: Annotated[
        str | None, typer.Option(help="vllm, sglang, llamacpp, moonshot or openai.", show_default="openai")
    ] = None,
    upstream_model: Annotated[
        str | None, typer.Option(help="The upstream's model name.", show_default="the public model id")
    ] = None,
    mmproj: Annotated[
        Path | None, typer.Option(help="Multimodal projector (GGUF) for the embedded model: it sees images.")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help="Server processes on this port (above 1: every model relayed to upstreams).",
            show_default="one per core when every model is relayed to upstreams, else 1",
        ),
    ] = None,
    contract: Annotated[
        str | None,
        typer.Option(
            help="Whose API rules to follow: evolink (the reference) or moonshot (Moonshot's own).",
            show_default=_default("contract"),
        ),
    ] = None,
) -> None:
    """Serve the Kimi API."""
    from kimi_server.bootstrap import build_engines, build_keys
    from kimi_server.gate.key_strength import check_operator_keys
    from kimi_server.heap import settle_heap
    from kimi_server.http.app import create_app
    from kimi_server.http.connections import check_uvicorn, uvicorn_options
    from kimi_server.http.workers import worker_count
    from kimi_server.models.pull import ModelPullError
    from kimi_server.settings import load_settings

    try:
        check_uvicorn()  # before a model is loaded: a uvicorn this was not written for never serves
        settings = load_settings(
            config,
            host=host,
            port=port,
            model=model,
            api_keys=api_key or None,
            ctx_size=ctx_size,
            parallel=parallel,
            threads=threads,
            models_dir=models_dir,
            admin_key=admin_key,
            upstream=upstream,
            upstream_dialect=upstream_dialect,
            upstream_model=upstream_model,
            mmproj=mmproj,
            workers=workers,
            contract=contract,
        )
        weak = check_operator_keys(settings)  # a weak key beyond loopback raises, before any set-up
        log_json.configure(settings.log_level)  # one JSON object per line, uvicorn's lines included
        for warning in weak:
            logging.getLogger(__name__).warning("%s", warning)
        engines = build_engines(settings)
        processes = worker_count(settings, engines)
    except (ModelPullError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    keys, dev_key = build_keys(settings)
    for line in start_lines(settings, sorted(engines.served()), dev_key):
        console.print(line, soft_wrap=True, highlight=False)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": log_json.log_config(settings.log_level),  # applied again in each worker
        "access_log": False,  # the request line (http/request_context.py) replaces it
        "timeout_graceful_shutdown": 5,
        **uvicorn_options(settings),  # idle and slow connections close
    }
    if processes > 1:
        from kimi_server.http import workers as worker_processes

        console.print(f"  workers: {processes} processes", highlight=False)
        worker_processes.run(settings, processes, options)
        return
    application = create_app(settings, engines, keys)
    settle_heap()
    uvicorn.run(application, **options)


plain_flags(app)  # flags in --help show no type; after the last command above


def main() -> None:
    app()


if __name__ == "__main__":
    main()
