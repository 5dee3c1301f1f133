"""`dex-celery calls list|show`.

What an operator reads when a model says "the tool did something odd": every call's status, the
policy that applied when it was requested (S1.5), each attempt with the worker that ran it and
when, a late result kept as evidence (S5.2), and the messages the model read. `--json` gives the
same data for scripts; secret argument values are redacted in both (S9.2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import click
import redis

from dex_celery.app import Dex
from dex_celery.backends import backend_errors, require_existing_database
from dex_celery.cli_context import DexContext, pass_context
from dex_celery.errors import InvalidRequest
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.outcomes import CallStatus
from dex_celery.records import Message, MessageRole, ToolCallRecord
from dex_celery.redact import redact
from dex_celery.report_text import already_reported
from dex_celery.textfmt import render_table, shorten
from dex_celery.timefmt import format_utc, parse_since

# --- rendering ---------------------------------------------------------------------------------


def format_time(value: float | None) -> str:
    """UTC with the zone shown, as every command prints times."""
    return format_utc(value)


def shown_arguments(record: ToolCallRecord) -> Any:
    """The call's arguments with the values of its policy's secret arguments replaced."""
    try:
        value = json.loads(record.arguments)
    except ValueError:
        return record.arguments
    if isinstance(value, dict):
        return redact(value, record.policy.secret_arguments)
    return value


def call_summary(record: ToolCallRecord) -> dict[str, Any]:
    return {
        "key": record.key,
        "session_id": record.session_id,
        "turn_id": record.turn_id,
        "tool_call_id": record.tool_call_id,
        "tool": record.tool_name,
        "effect": record.effect.value,
        "status": record.status.value,
        "attempts": record.attempts,
        "requested_at": record.requested_at,
        "finished_at": record.finished_at,
        "error": record.error,
    }


def _attempts(record: ToolCallRecord, entry: LedgerCall | None) -> list[dict[str, Any]]:
    """Finished attempts from the SQL attempt log (or the ledger's, if SQL has none yet), and
    the current attempt when the ledger still holds one in flight."""
    attempts: list[dict[str, Any]] = []
    if record.attempt_log:
        try:
            attempts = list(json.loads(record.attempt_log))
        except ValueError:
            attempts = []
    if not attempts and entry is not None:
        attempts = [
            {
                "attempt": e.attempt,
                "state": e.state,
                "owner": e.owner or None,
                "claimed_at": e.claimed_at,
                "ended_at": e.ended_at,
            }
            for e in entry.log
        ]
    attempts = _with_error(attempts, record, entry)
    if entry is None or entry.state not in ("enqueued", "running"):
        return attempts
    if all(a.get("attempt") != entry.attempt for a in attempts):
        attempts.append(
            {
                "attempt": entry.attempt,
                "state": entry.state,
                "owner": entry.owner or None,
                "claimed_at": None,
                "ended_at": None,
            }
        )
    return attempts


#: What an attempt's end state says when no message of its own was kept.
ATTEMPT_STATES = {
    "failed": "the tool reported a failure (retried: its class allows it)",
    "lost": "the worker stopped after claiming it (crash, kill, lost connection or lapsed "
    "heartbeat)",
    "expired": "it never reached a worker before its schedule-to-start deadline",
    "timed_out": "it ran past its start-to-close timeout and was cancelled",
    "unconfirmed": "its worker could not commit its claim of this write in the database and "
    "ran no tool code",
}


def _with_error(
    attempts: list[dict[str, Any]], record: ToolCallRecord, entry: LedgerCall | None
) -> list[dict[str, Any]]:
    """Each attempt's error and the Celery node name of the worker that ran it.

    The last attempt of an ended call carries the call's error; the attempt whose failure
    caused the last retry, the message the ledger kept for that retry; any other what its end
    state means (the attempt log keeps states, not messages).
    """
    out = []
    for i, original in enumerate(attempts):
        attempt = dict(original)
        state = str(attempt.get("state") or "")
        if not attempt.get("error"):
            if state in ("succeeded", "enqueued", "running"):
                attempt["error"] = None
            elif i == len(attempts) - 1 and record.finished and record.error:
                attempt["error"] = record.error
            elif i == len(attempts) - 2 and entry is not None and entry.error != record.error:
                attempt["error"] = entry.error or ATTEMPT_STATES.get(state, state or None)
            else:
                attempt["error"] = ATTEMPT_STATES.get(state, state or None)
        owner = str(attempt.get("owner") or "")
        node, _, pid = owner.rpartition(":")
        attempt["node"] = node if "@" in node else None
        attempt["pid"] = int(pid) if pid.isdigit() else None
        out.append(attempt)
    return out


def _ledger_view(entry: LedgerCall | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    view = dataclasses.asdict(entry)
    view.pop("log", None)
    return view


def _messages_of(record: ToolCallRecord, history: Sequence[Message]) -> list[dict[str, Any]]:
    """The TOOL message reporting this call, and user messages that mention its key (reports
    sent by reconciliation, S8.1)."""
    out = []
    for m in history:
        mine = m.role is MessageRole.TOOL and (m.turn_id, m.tool_call_id) == (
            record.turn_id,
            record.tool_call_id,
        )
        mentions = m.role is MessageRole.USER and already_reported(record.key, m.text or "")
        if mine or mentions:
            out.append(
                {
                    "id": m.id,
                    "role": m.role.value,
                    "text": m.text,
                    "tool_output": m.tool_output,
                    "created_at": m.created_at,
                }
            )
    return out


def call_details(dex: Dex, record: ToolCallRecord) -> dict[str, Any]:
    ledger_error = None
    try:
        entry = dex.ledger.read(record.key)
    except redis.RedisError as e:  # SQL alone still answers; say why the ledger part is missing
        entry, ledger_error = None, f"{type(e).__name__}: {e}"
    _calls, history = dex.store.snapshot(record.session_id)
    details = call_summary(record)
    details.update(
        arguments=shown_arguments(record),
        result=record.result,
        policy=json.loads(record.policy.to_json()),
        approval_deadline=record.approval_deadline,
        approval=dataclasses.asdict(record.approval) if record.approval else None,
        attempt_log=_attempts(record, entry),
        ledger=_ledger_view(entry),
        ledger_error=ledger_error,
        late_result=_late(record.late_result or (entry.late if entry else None)),
        ledger_epoch=record.ledger_epoch,
        messages=_messages_of(record, history),
    )
    return details


def _late(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


#: The policy fields `calls show` prints, in order.
POLICY_FIELDS = (
    "effect",
    "effect_source",
    "requires_approval",
    "max_attempts",
    "schedule_to_start",
    "start_to_close",
    "heartbeat_timeout",
    "approval_timeout",
)


def render_details(d: dict[str, Any]) -> str:
    """`calls show` as text, from the same value `--json` prints (`call_details`)."""
    lines = [
        f"call      {d['key']}",
        f"tool      {d['tool']}  ({d['effect']})",
        f"status    {d['status']}",
        f"arguments {json.dumps(d['arguments'], ensure_ascii=False)}",
        f"requested {format_time(d['requested_at'])}",
        f"finished  {format_time(d['finished_at'])}",
    ]
    if d["error"]:
        lines.append(f"error     {d['error']}")
    if d["result"] is not None:
        lines.append(f"result    {shorten(d['result'], 200)}")
    lines.append(_policy_line(d["policy"]))
    if d["approval_deadline"] or d["approval"]:
        lines.append(_approval_line(d["approval_deadline"], d["approval"]))
    lines.extend(_attempt_lines(d["attempt_log"]))
    if d["late_result"] is not None:
        lines.append(f"late      {json.dumps(d['late_result'], ensure_ascii=False)}")
    lines.append(_ledger_line(d["ledger"], d.get("ledger_error")))
    lines.extend(_message_lines(d["messages"]))
    return "\n".join(lines)


def _policy_line(policy: dict[str, Any]) -> str:
    shown = ", ".join(f"{k}={policy[k]}" for k in POLICY_FIELDS)
    if policy["secret_arguments"]:
        shown += f", secret_arguments={','.join(policy['secret_arguments'])}"
    return "policy    " + shown


def _approval_line(deadline: float | None, approval: dict[str, Any] | None) -> str:
    decided = "not decided"
    if approval:
        decided = (
            f"{approval['decision']} by {approval['decided_by']} at "
            f"{format_time(approval['decided_at'])}"
            + (f": {approval['note']}" if approval["note"] else "")
        )
    return f"approval  deadline {format_time(deadline)}; {decided}"


def _attempt_lines(attempt_log: list[dict[str, Any]]) -> list[str]:
    if not attempt_log:
        return ["attempts", "  (none)"]
    rows = [
        [
            str(a.get("attempt")),
            str(a.get("state")),
            str(a.get("owner") or "-"),
            format_time(a.get("claimed_at")),
            format_time(a.get("ended_at")),
            shorten(a.get("error"), 120) or "-",
        ]
        for a in attempt_log
    ]
    table = render_table(["#", "state", "worker", "claimed", "ended", "error"], rows)
    return ["attempts", *("  " + row for row in table.splitlines())]


def _ledger_line(ledger: dict[str, Any] | None, error: str | None) -> str:
    if ledger:
        return (
            f"ledger    status={ledger['status'] or '-'} attempt={ledger['attempt']} "
            f"state={ledger['state']} owner={ledger['owner'] or '-'}"
        )
    if error:
        return f"ledger    unavailable ({error})"
    return "ledger    (no entry: finished and expired, or never opened)"


def _message_lines(messages: list[dict[str, Any]]) -> list[str]:
    lines = ["messages"]
    if not messages:
        lines.append("  (none)")
    for m in messages:
        text = m["tool_output"] if m["role"] == "tool" else m["text"]
        lines.append(f"  [{m['role']}] {format_time(m['created_at'])}  {shorten(text, 300)}")
    return lines


@contextlib.contextmanager
def database_errors(dex: Dex) -> Iterator[None]:
    """A database without the schema (or none at all) is a one-line error, not a traceback."""
    with backend_errors(dex.settings.redis_url, dex.settings.database_url):
        yield


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


# --- calls -------------------------------------------------------------------------------------


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
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
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
    more = make_cursor(records[-1]) if len(records) == limit else None
    if as_json:
        emit_json([call_summary(r) for r in records])
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
            str(r.attempts),
            format_time(r.requested_at),
            shorten(r.error, 60),
        ]
        for r in records
    ]
    click.echo(
        render_table(["KEY", "TOOL", "EFFECT", "STATUS", "ATTEMPTS", "REQUESTED", "ERROR"], rows)
    )
    if more:
        click.echo(f"older calls: dex-celery calls list --before {more} (with the same filters)")


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
@pass_context
def calls_show(ctx: DexContext, key: str, as_json: bool) -> None:
    """Everything known about one call (KEY is session/turn/call; times in UTC)."""
    require_existing_database(ctx.dex.settings.database_url)
    with database_errors(ctx.dex):
        record = ctx.dex.client().get_call(key)
        details = call_details(ctx.dex, record)
    if as_json:
        emit_json(details)
    else:
        click.echo(render_details(details))


# --- sweep -------------------------------------------------------------------------------------


commands: list[click.Command] = [calls]
