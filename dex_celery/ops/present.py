"""How records look to a person: a call's details, plain-text tables, times.

The one presentation module: `dex-celery calls`, the web app's call page and the demo all go
through it, so a call reads the same wherever it is shown (and none of them imports another
for it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import redis

from dex_celery.engine.runtime import RuntimeSource
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.model.records import Message, MessageRole, ToolCallRecord
from dex_celery.model.report_text import already_reported
from dex_celery.model.times import format_utc
from dex_celery.tools.redact import record_arguments


def shorten(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain aligned table: readable in a terminal, a log file and a CI transcript alike."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


# --- rendering ---------------------------------------------------------------------------------


def format_time(value: float | None) -> str:
    """UTC with the zone shown, as every command prints times."""
    return format_utc(value)


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


def call_details(source: RuntimeSource, record: ToolCallRecord) -> dict[str, Any]:
    ledger_error = None
    try:
        entry = source.runtime.ledger.read(record.key)
    except redis.RedisError as e:  # SQL alone still answers; say why the ledger part is missing
        entry, ledger_error = None, f"{type(e).__name__}: {e}"
    _calls, history = source.runtime.store.snapshot(record.session_id)
    details = call_summary(record)
    details.update(
        arguments=record_arguments(record),  # the one display rule (tools/redact.py)
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
