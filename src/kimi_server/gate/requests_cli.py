"""``kimi-server requests``: the request log from the ledger, newest first, filtered; or one
request with ``--id`` (with its captured prompt and answer, where its key or team keeps them)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from kimi_server.errors import NotFoundError
from kimi_server.gate.captures import load_capture
from kimi_server.gate.cli_common import AsCsv, AsJson, Config, Stores, out, run, show_rows, when
from kimi_server.gate.request_log import MAX_ROWS, RequestFilter, list_requests, one_request
from kimi_server.gate.usage_cli import key_id_named, team_id_named

COLUMNS = (
    "created_at",
    "request_id",
    "key_name",
    "team",
    "model",
    "status",
    "finish_reason",
    "error_code",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "ttft_ms",
    "duration_ms",
)


def requests(
    key: Annotated[str | None, typer.Option("--key", help="Only this key (name or id).")] = None,
    team: Annotated[str | None, typer.Option("--team", help="Only this team (name or id).")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Only keys with this tag.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="completed, cancelled or failed.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="From this date or ISO time (UTC).")] = None,
    until: Annotated[str | None, typer.Option("--until", help="Before this date or ISO time (UTC).")] = None,
    slow: Annotated[float | None, typer.Option("--slow", min=0, help="Only those that took over SECONDS.")] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Only failed requests.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_ROWS, help="At most this many.")] = 100,
    request_id: Annotated[str | None, typer.Option("--id", help="Show this one request in full.")] = None,
    config: Config = None,
    as_json: AsJson = False,
    as_csv: AsCsv = False,
) -> None:
    """Lists requests from the ledger: timings, tokens, cost, finish reason and error."""
    if request_id is not None:
        _one(request_id, config, as_json, as_csv)
        return
    start, end = when(since, "--since"), when(until, "--until")

    async def work(s: Stores) -> list[dict[str, Any]]:
        found = RequestFilter(
            key_id=await key_id_named(s, key),
            team_id=await team_id_named(s, team),
            tag=tag,
            model=model,
            status=status,
            since=start,
            until=end,
            slow_ms=None if slow is None else slow * 1000,
            failed=failed,
            limit=limit,
        )
        return await list_requests(s.db, found)

    show_rows(run(config, work), COLUMNS, as_json, as_csv)


def _one(request_id: str, config: Any, as_json: bool, as_csv: bool) -> None:
    async def work(s: Stores) -> dict[str, Any]:
        row = await one_request(s.db, request_id)
        if row is None:
            raise NotFoundError(f"No request with id '{request_id}' in the ledger.", param="--id")
        return {**row, "capture": await load_capture(s.db, row["request_id"])}

    row = run(config, work)
    if as_json:
        print(json.dumps(row, indent=2))
        return
    capture = row.pop("capture")
    show_rows([row], list(row), False, as_csv)
    if capture is not None and not as_csv:
        for message in capture["prompt"]:
            out.print(f"\n[bold]{message['role']}[/bold]", highlight=False)
            print(message.get("text", ""))
        out.print("\n[bold]answer[/bold]", highlight=False)
        if capture["reasoning"]:
            print(f"(reasoning) {capture['reasoning']}")
        print(capture["answer"])
        for call in capture["tool_calls"]:
            print(f"(tool call) {call['name']}({call['arguments']})")
