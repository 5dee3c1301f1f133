"""`dex-celery sessions show`: one session as one story, in time order (S13.6).

What a person investigating a conversation reads instead of `calls list --session`, `calls show`
per call, the approvals page and the reconcile log: the messages, each call with its attempts and
approval, the tool results the model read and the reports it was sent, as the web app's session
page shows them (both render `ops/timeline.py`). Times in UTC; secret arguments as `***`.
"""

from __future__ import annotations

import click

from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.calls import database_errors, emit_json
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.ops.present import command_line, format_time, render_table, shorten
from dex_celery.ops.timeline import Entry, EntryKind, Timeline, session_timeline

#: Characters of an entry's text shown on its line unless `--full`.
TEXT_SHOWN = 300
#: The width of the kind column: the longest kind's label.
KIND_WIDTH = max(len(kind.label) for kind in EntryKind)


@click.group("sessions")
def sessions() -> None:
    """Read a session as one story: messages, calls, attempts, approvals, reports."""


@sessions.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--full", is_flag=True, help="Show long values whole (they are cut otherwise).")
@pass_context
def sessions_show(ctx: DexContext, session_id: str, as_json: bool, full: bool) -> None:
    """Everything that happened in session SESSION_ID, oldest first (times in UTC)."""
    require_existing_database(ctx.dex.settings.database_url)
    with database_errors(ctx.dex):
        timeline = session_timeline(
            ctx.dex, session_id, checked_tools=ctx.dex.outcome_checks.tool_names, full=full
        )
    if as_json:
        emit_json(timeline.as_dict())
    else:
        click.echo(render_timeline(timeline, app=ctx.app_path))


def render_timeline(timeline: Timeline, *, app: str | None = None) -> str:
    """The timeline as text: the session, its calls as a table, then one line per entry (its
    text indented beneath)."""
    open_note = f"; {len(timeline.open_calls)} still open" if timeline.live else ""
    lines = [
        f"session   {timeline.session_id}",
        f"opened    {format_time(timeline.created_at)}",
        f"calls     {len(timeline.calls)}{open_note}",
    ]
    if timeline.calls:
        rows = [
            [c["key"], c["tool"], c["effect"], c["status"], str(c["attempts"])]
            for c in timeline.calls
        ]
        table = render_table(["KEY", "TOOL", "EFFECT", "STATUS", "ATTEMPTS"], rows)
        lines.extend("  " + row for row in table.splitlines())
    if timeline.ledger_error:
        lines.append(f"ledger    unavailable ({timeline.ledger_error}); attempts as SQL has them")
    lines.append("timeline")
    for entry in timeline.entries:
        lines.extend(_entry_lines(entry, timeline.full))
    if timeline.cut:
        whole = command_line(app, "sessions", "show", timeline.session_id, "--full")
        lines.append(f"(long values are cut; `{whole}` shows them whole)")
    return "\n".join(lines)


def _entry_lines(entry: Entry, full: bool) -> list[str]:
    who = f" [{entry.actor}]" if entry.actor and entry.actor not in entry.summary else ""
    call = f"  ({entry.call_name})" if entry.call_name else ""
    out = [
        f"  {format_time(entry.at)}  {entry.kind.label:<{KIND_WIDTH}}  {entry.summary}{who}{call}"
    ]
    if entry.text:
        text = entry.text if full else shorten(entry.text, TEXT_SHOWN)
        out.append(" " * (2 + len(format_time(entry.at)) + 2 + KIND_WIDTH + 2) + text)
    return out
