"""`dex-celery calls list|show`.

What an operator reads when a model says "the tool did something odd": every call's status, the
policy that applied when it was requested (S1.5), each attempt with the worker that ran it and
when, a late result kept as evidence (S5.2), and the messages the model read. `--json` gives the
same data for scripts; secret argument values are redacted in both (S9.2).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import click

from dex_celery.app import Dex
from dex_celery.backend_errors import backend_errors, require_existing_database
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.errors import InvalidRequest
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import parse_since
from dex_celery.ops.present import (
    call_details,
    call_summary,
    command_line,
    format_time,
    render_details,
    render_table,
    shorten,
    started_counts,
)


@contextlib.contextmanager
def database_errors(dex: Dex) -> Iterator[None]:
    """A database without the schema (or none at all) is a one-line error, not a traceback."""
    with backend_errors(dex.settings.redis_url, dex.settings.database_url):
        yield


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


# --- calls -------------------------------------------------------------------------------------

#: Calls `calls list` shows at a time unless told otherwise.
LIST_LIMIT = 100


@click.group("calls")
def calls() -> None:
    """Inspect tool calls: their status, policy, attempts and messages."""


@calls.command("list")
@click.option(
    "--status",
    type=click.Choice([s.value for s in CallStatus]),
    help="Only calls with this status.",
)
@click.option("--session", "session_id", help="Only calls of this session.")
@click.option(
    "--since", help="Only calls requested since: 15m, 2h, 1d, or an ISO time (UTC by default)."
)
@click.option("--before", "cursor", help="The next page: the cursor the previous page printed.")
@click.option("--limit", type=click.IntRange(min=1), default=LIST_LIMIT, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_context
def calls_list(
    ctx: DexContext,
    status: str | None,
    session_id: str | None,
    since: str | None,
    cursor: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List calls, newest first, LIMIT at a time (times in UTC)."""
    since_at = parse_since(since) if since else None
    before = parse_cursor(cursor) if cursor else None
    require_existing_database(ctx.dex.settings.database_url)
    with database_errors(ctx.dex):
        records = ctx.dex.store.recent_calls(
            status=CallStatus(status) if status else None,
            session_id=session_id,
            since=since_at,
            before=before,
            limit=limit,
        )
        started = started_counts(ctx.dex, records)
    more = make_cursor(records[-1]) if len(records) == limit else None
    if as_json:
        emit_json([call_summary(r, started[r.key]) for r in records])
        return
    if not records:
        click.echo("no calls")
        return
    rows = [
        [
            r.key,
            r.tool_name,
            r.effect.value,
            r.status.value,
            str(started[r.key]),
            format_time(r.requested_at),
            shorten(r.error, 60),
        ]
        for r in records
    ]
    click.echo(
        render_table(["KEY", "TOOL", "EFFECT", "STATUS", "ATTEMPTS", "REQUESTED", "ERROR"], rows)
    )
    if more:
        filters = [
            *(["--status", status] if status else []),
            *(["--session", session_id] if session_id else []),
            *(["--since", since] if since else []),
            *(["--limit", str(limit)] if limit != LIST_LIMIT else []),
        ]
        next_page = command_line(ctx.app_path, "calls", "list", *filters, "--before", more)
        click.echo(f"older calls: {next_page}")


def make_cursor(record: ToolCallRecord) -> str:
    """Where the next page starts: `<requested_at>,<key>` of the last call shown."""
    return f"{record.requested_at!r},{record.key}"


def parse_cursor(text: str) -> tuple[float, str]:
    at, _, key = text.partition(",")
    try:
        return float(at), key
    except ValueError:
        raise InvalidRequest(
            f"--before {text!r} is not a cursor printed by `calls list` (<time>,<key>)"
        ) from None


@calls.command("show")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--full", is_flag=True, help="Show long values whole (they are cut otherwise).")
@pass_context
def calls_show(ctx: DexContext, key: str, as_json: bool, full: bool) -> None:
    """Everything known about one call (KEY is session/turn/call; times in UTC)."""
    require_existing_database(ctx.dex.settings.database_url)
    with database_errors(ctx.dex):
        record = ctx.dex.client().get_call(key)
        details = call_details(ctx.dex, record, full=full)
    if as_json:
        emit_json(details)
    else:
        click.echo(render_details(details, full=full, app=ctx.app_path))


# --- sweep -------------------------------------------------------------------------------------
