"""The ``chat`` command's flags; the session itself (and the openai SDK) loads only when it runs."""

from __future__ import annotations

from typing import Annotated

import typer

from kimi_server.settings import Settings

DEFAULT_URL = f"http://127.0.0.1:{Settings.model_fields['port'].default}/v1"


def chat(
    url: Annotated[
        str, typer.Option(envvar="KIMI_BASE_URL", help="The API's base URL (…/v1): this server or another.")
    ] = DEFAULT_URL,
    key: Annotated[
        str | None,
        typer.Option(
            help="API key.", show_default="$KIMI_API_KEY, else $OPENAI_API_KEY, else the local development key"
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model id.", show_default="the first Kimi model served")] = None,
    effort: Annotated[str | None, typer.Option(help="Reasoning effort.", show_default="the server's")] = None,
    responses: Annotated[bool, typer.Option("--responses", help="Start on /v1/responses.")] = False,
    hide_reasoning: Annotated[
        bool, typer.Option("--hide-reasoning", help="Show one 'thought for N tokens' line instead of the reasoning.")
    ] = False,
    system: Annotated[str | None, typer.Option(help="A system message for the conversation.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(min=1, help="Output tokens per turn, reasoning included.", show_default="the server's")
    ] = None,
) -> None:
    """Chat in the terminal with a running server (or any OpenAI-compatible API)."""
    from kimi_server.chat_cli.repl import run

    run(url, key, model, effort, responses, hide_reasoning, system, max_tokens)
