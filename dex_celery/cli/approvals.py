"""`dex-celery approvals`: list, approve and reject the calls that wait for a person (S6).

    dex-celery approvals list [--session ID] [--limit N] [--json]
    dex-celery approvals approve KEY --by NAME [--note TEXT] [--edit JSON]
    dex-celery approvals reject KEY --by NAME [--reason TEXT]

Exit codes (see `cli.py`): 0 done, 1 refused (unknown or malformed key, decided already, not
waiting, deadline passed; one line `error: ...` on stderr, nothing changed), 2 bad usage.
"""

from __future__ import annotations

import json

import click

from dex_celery.backend_errors import require_existing_database
from dex_celery.cli.context import DexContext, pass_context
from dex_celery.engine import DEFAULT_LIST_LIMIT, PendingApproval
from dex_celery.model.records import ToolCallRecord
from dex_celery.model.times import format_utc


@click.group()
def approvals() -> None:
    """Calls waiting for a person's decision."""


@approvals.command("list")
@click.option("--session", "session_id", default=None, help="Only this session's calls.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIST_LIMIT,
    show_default=True,
    help="Show at most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_context
def list_approvals(ctx: DexContext, session_id: str | None, limit: int, as_json: bool) -> None:
    """Calls waiting for approval, oldest first (secret arguments shown as ***)."""
    require_existing_database(ctx.dex.settings.database_url)
    pending = ctx.dex.approvals.pending(session_id, limit=limit)
    if as_json:
        click.echo(json.dumps([p.as_dict() for p in pending], indent=2, sort_keys=True))
        return
    if not pending:
        click.echo("no calls are waiting for approval")
        return
    for p in pending:
        click.echo(_line(p))


@approvals.command("approve")
@click.argument("key")
@click.option("--by", "approver", required=True, help="Who approves (recorded).")
@click.option("--note", default=None, help="Why, recorded with the decision.")
@click.option(
    "--edit",
    default=None,
    metavar="JSON",
    help="Run it with these arguments instead (the whole JSON object; a secret given as *** "
    "keeps its value). Checked against the tool's schema and recorded; the model reads it.",
)
@pass_context
def approve(ctx: DexContext, key: str, approver: str, note: str | None, edit: str | None) -> None:
    """Approve KEY (session/turn/call); it is dispatched under its recorded policy."""
    record = ctx.dex.approvals.approve(key, approver, note, edit=edit)
    edited = " with edited arguments" if record.approval_edit is not None and edit else ""
    click.echo(f"approved {record.key} by {approver}{edited}; dispatched ({_state(record)})")


@approvals.command("reject")
@click.argument("key")
@click.option("--by", "approver", required=True, help="Who rejects (recorded).")
@click.option("--reason", default=None, help="Why; the model reads it in the tool result.")
@pass_context
def reject(ctx: DexContext, key: str, approver: str, reason: str | None) -> None:
    """Reject KEY (session/turn/call); it ends rejected and never runs."""
    record = ctx.dex.approvals.reject(key, approver, reason)
    click.echo(f"rejected {record.key} by {approver}; it will not run")


def _line(p: PendingApproval) -> str:
    arguments = json.dumps(p.arguments, sort_keys=True, ensure_ascii=False)
    if len(arguments) > 120:
        arguments = arguments[:117] + "..."
    line = (
        f"{p.key}  {p.tool_name}  {p.effect.value}  requested {format_utc(p.requested_at, millis=False)}  "
        f"deadline {format_utc(p.deadline, millis=False)}  {arguments}"
    )
    if p.repeat is not None:
        line += f"\n    held back: {p.repeat.reason}; now: {p.repeat.now_text}"
    if p.budget_reason is not None:
        line += f"\n    over budget: {p.budget_reason}"
    if p.waits_again is not None:
        line += f"\n    waits again: {p.waits_again}"
    if p.preview is not None:
        line += f"\n    preview: {p.preview}"
    if p.frozen is not None:
        line += f"\n    held: {p.frozen}"
    return line


def _state(record: ToolCallRecord) -> str:
    return f"status {record.status.value}"
