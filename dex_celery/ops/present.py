"""How records look to a person: a call's details, plain-text tables, times.

The one presentation module: `dex-celery calls`, the web app's call page and the demo all go
through it, so a call reads the same wherever it is shown (and none of them imports another
for it).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from dex_celery.engine import (
    PendingApproval,
    RuntimeSource,
    parse_owner,
    repeat_evidence,
    shown_preview,
)
from dex_celery.errors import DexError
from dex_celery.ledger.ledger import LedgerCall
from dex_celery.model.effects import traits_of
from dex_celery.model.records import Message, MessageRole, ToolCallRecord
from dex_celery.model.report_text import already_reported
from dex_celery.model.times import format_utc
from dex_celery.ops.budgets import budget_lines, call_budgets
from dex_celery.tools.redact import record_arguments
from dex_celery.tools.tool import Tool


def shorten(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


#: How many characters of one value (an argument, a result, an error, a message) a person is
#: shown before it is cut: a call whose arguments weigh a megabyte must not print a megabyte.
VALUE_LIMIT = 2000


#: What a cut value says where it was cut, before how much was.
CUT_MARK = "… [cut: "


def cut_text(text: str, limit: int = VALUE_LIMIT) -> tuple[str, bool]:
    """`text`, or its first `limit` characters and a marker saying how much was cut."""
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}{CUT_MARK}{len(text) - limit:,} more characters]", True


def cut_value(value: Any, limit: int = VALUE_LIMIT) -> tuple[Any, bool]:
    """A JSON value with every long string cut (`cut_text`), its shape kept; and whether any
    was. A value whose encoding is still longer than `limit` (many short leaves) becomes its cut
    encoding, a string."""
    cut = False

    def walk(v: Any) -> Any:
        nonlocal cut
        if isinstance(v, str):
            text, was = cut_text(v, limit)
            cut = cut or was
            return text
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    shown = walk(value)
    encoded = json.dumps(shown, ensure_ascii=False)
    if len(encoded) > 2 * limit:
        return cut_text(encoded, 2 * limit)[0], True
    return shown, cut


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


def attempts_started(record: ToolCallRecord, entry: LedgerCall | None) -> int:
    """Attempts a worker has started (claimed) so far: the record counts them once the call
    ends; while it is in flight the ledger knows (an attempt waiting in the queue has not)."""
    if record.finished or entry is None or entry.status != "active":
        return record.attempts
    started = entry.attempt if entry.state != "enqueued" else entry.attempt - 1
    return max(record.attempts, started)


def started_counts(source: RuntimeSource, records: Sequence[ToolCallRecord]) -> dict[str, int]:
    """`attempts_started` of each call of a listing; the ledger is read only for calls in
    flight, in one round trip. Redis away: the record's own count."""
    live = [r for r in records if not r.finished]
    entries: dict[str, LedgerCall | None] = {}
    try:
        entries = source.runtime.ledger.read_many([r.key for r in live])
    except redis.RedisError:
        entries = {}
    return {r.key: attempts_started(r, entries.get(r.key)) for r in records}


def call_summary(record: ToolCallRecord, started: int | None = None) -> dict[str, Any]:
    """A call as a listing shows it; `attempts` counts attempts started (`attempts_started`)."""
    return {
        "key": record.key,
        "session_id": record.session_id,
        "turn_id": record.turn_id,
        "tool_call_id": record.tool_call_id,
        "tool": record.tool_name,
        "effect": record.effect.value,
        "status": record.status.value,
        "attempts": record.attempts if started is None else started,
        "requested_at": record.requested_at,
        "finished_at": record.finished_at,
        "error": record.error,
    }


def attempt_history(record: ToolCallRecord, entry: LedgerCall | None) -> list[dict[str, Any]]:
    """Finished attempts from the SQL attempt log (or the ledger's, if SQL has none yet), and
    the current attempt when the ledger still holds one in flight: `running` with its worker
    and claim time, or `enqueued` (waiting for a worker)."""
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
                "error": e.error or None,
            }
            for e in entry.log
        ]
    in_flight = (
        not record.finished
        and entry is not None
        and entry.status == "active"
        and entry.state in ("enqueued", "running")
    )
    if in_flight and entry is not None and all(a.get("attempt") != entry.attempt for a in attempts):
        attempts.append(
            {
                "attempt": entry.attempt,
                "state": entry.state,
                "owner": entry.owner or None,
                "claimed_at": entry.claimed_at if entry.state == "running" else None,
                "ended_at": None,
                "error": None,
                # Why it still waits, as a worker that handed it back said (version skew).
                "note": (entry.waiting or None) if entry.state == "enqueued" else None,
            }
        )
    return _with_error(attempts, record)


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


def _with_error(attempts: list[dict[str, Any]], record: ToolCallRecord) -> list[dict[str, Any]]:
    """Each attempt's error, about that attempt only, and the Celery node name of the worker
    that ran it.

    An attempt keeps the message it ended with (the ledger logs it); one without gets what its
    end state means. Only a last attempt whose tool reported the failure takes the call's error
    (the tool's own message): the call's error may speak of several attempts.
    """
    out = []
    for i, original in enumerate(attempts):
        attempt = dict(original)
        state = str(attempt.get("state") or "")
        if state in ("succeeded", "enqueued", "running"):
            attempt["error"] = None
        elif not attempt.get("error"):
            last = i == len(attempts) - 1
            if last and state == "failed" and record.finished and record.error:
                attempt["error"] = record.error
            else:
                attempt["error"] = ATTEMPT_STATES.get(state, state or None)
        owner = parse_owner(str(attempt.get("owner") or ""))
        attempt["node"] = owner.node if "@" in owner.node else None
        attempt["pid"] = owner.pid
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


#: How many of the session's user and assistant messages before a call its details show.
CONVERSATION_SHOWN = 6


def conversation_before(
    history: Sequence[Message], at: float, limit: int = CONVERSATION_SHOWN
) -> list[dict[str, Any]]:
    """The last `limit` user and assistant messages of the session written no later than the
    call, oldest first: what led to it, whether the agent loop wrote them through dex or a
    framework's history was copied in (S12.1; copies are scrubbed of the call's secrets)."""
    shown = [
        m
        for m in history
        if m.created_at <= at and m.role in (MessageRole.USER, MessageRole.ASSISTANT) and m.text
    ]
    return [
        {"id": m.id, "role": m.role.value, "text": m.text, "created_at": m.created_at}
        for m in shown[-limit:]
    ]


def call_details(
    source: RuntimeSource, record: ToolCallRecord, *, full: bool = False
) -> dict[str, Any]:
    """Everything known about one call, as `calls show` (text and `--json`) and the web call
    page show it. Long values are cut (`cut_value`, `"cut": true`) unless `full`."""
    ledger_error = None
    try:
        entry = source.runtime.ledger.read(record.key)
    except redis.RedisError as e:  # SQL alone still answers; say why the ledger part is missing
        entry, ledger_error = None, f"{type(e).__name__}: {e}"
    _calls, history = source.runtime.store.snapshot(record.session_id)
    details = call_summary(record, attempts_started(record, entry))
    details.update(
        arguments=record_arguments(record),  # the one display rule (tools/redact.py)
        result=record.result,
        policy=json.loads(record.policy.to_json()),
        approval_deadline=record.approval_deadline,
        approval=dataclasses.asdict(record.approval) if record.approval else None,
        # Bound to what was approved (S13.3): an approver's edit, and why it waits again.
        edit=record.approval_edit.as_dict() if record.approval_edit else None,
        waits_again=record.rewait_reason,
        attempt_log=attempt_history(record, entry),
        ledger=_ledger_view(entry),
        ledger_error=ledger_error,
        late_result=_late(record.late_result or (entry.late if entry else None)),
        ledger_epoch=record.ledger_epoch,
        messages=_messages_of(record, history),
        conversation=conversation_before(history, record.requested_at),
    )
    evidence = repeat_evidence(source.runtime.store, record)
    details["repeat"] = evidence.as_dict() if evidence is not None else None
    # Write budgets (S13.1): what the call was charged, the limit it was judged by, each scope
    # now, and why it waits (or was rejected) when one had too little left.
    details["budgets"] = call_budgets(source, record) if record.budgets else []
    details["budget_reason"] = record.budget_reason
    runtime = source.runtime
    now = time.time() if ledger_error is not None else runtime.ledger.now()
    details["preview"] = shown_preview(record, runtime.tools, runtime.settings, now)
    details["cut"] = False if full else _cut_details(details)
    return details


def _cut_details(d: dict[str, Any]) -> bool:
    """Cut every long value of `call_details` in place; whether any was."""
    cut = False
    for name in ("arguments", "late_result"):
        d[name], was = cut_value(d[name])
        cut = cut or was
    for name in ("result", "error"):
        if isinstance(d[name], str):
            d[name], was = cut_text(d[name])
            cut = cut or was
    for holder, name in (
        [(a, "error") for a in d["attempt_log"]]
        + [(m, field) for m in d["messages"] for field in ("text", "tool_output")]
        + [(m, "text") for m in d["conversation"]]
    ):
        if isinstance(holder.get(name), str):
            holder[name], was = cut_text(holder[name])
            cut = cut or was
    return cut


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


def render_details(d: dict[str, Any], *, full: bool = False, app: str | None = None) -> str:
    """`calls show` as text, from the same value `--json` prints (`call_details`); `full`:
    nothing shortened to fit a line either; `app`: as the person named it, for the hint."""
    lines = [
        f"call      {d['key']}",
        f"tool      {d['tool']}  ({d['effect']})",
        f"status    {d['status']}",
        f"started   {d['attempts']} attempt{'' if d['attempts'] == 1 else 's'}",
        f"arguments {json.dumps(d['arguments'], ensure_ascii=False)}",
        f"requested {format_time(d['requested_at'])}",
        f"finished  {format_time(d['finished_at'])}",
    ]
    if d["error"]:
        lines.append(f"error     {d['error']}")
    if d["result"] is not None:
        lines.append(f"result    {d['result']}")
    lines.append(_policy_line(d["policy"]))
    if d["approval_deadline"] or d["approval"]:
        lines.append(_approval_line(d["approval_deadline"], d["approval"]))
    if d.get("edit"):
        edit = d["edit"]
        lines.append(
            f"edited    by {edit['by']} at {format_time(edit['at'])}: "
            f"{json.dumps(edit['before'], ensure_ascii=False)} -> "
            f"{json.dumps(edit['after'], ensure_ascii=False)}"
        )
    if d.get("waits_again"):
        lines.append(f"waits     again: {d['waits_again']}")
    if d.get("preview"):
        lines.append(f"preview   {d['preview']}")
    if d.get("repeat"):
        lines.append(f"repeat    held back: {d['repeat']['reason']}")
        lines.append(f"          now: {d['repeat']['earlier_now']}")
    lines.extend(budget_lines(d.get("budgets") or [], d.get("budget_reason")))
    lines.extend(_attempt_lines(d["attempt_log"], full))
    if d["late_result"] is not None:
        lines.append(f"late      {json.dumps(d['late_result'], ensure_ascii=False)}")
    lines.append(_ledger_line(d["ledger"], d.get("ledger_error")))
    lines.extend(_conversation_lines(d["conversation"], full))
    lines.extend(_message_lines(d["messages"], full))
    if d.get("cut"):
        whole = command_line(app, "calls", "show", d["key"], "--full")
        lines.append(f"(long values are cut; `{whole}` shows them whole)")
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


def _attempt_lines(attempt_log: list[dict[str, Any]], full: bool = False) -> list[str]:
    if not attempt_log:
        return ["attempts", "  (none)"]
    rows = [
        [
            str(a.get("attempt")),
            str(a.get("state")),
            str(a.get("owner") or "-"),
            format_time(a.get("claimed_at")),
            format_time(a.get("ended_at")),
            (a.get("error") or a.get("note") or "-")
            if full
            else (shorten(a.get("error") or a.get("note"), 120) or "-"),
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


def _conversation_lines(conversation: list[dict[str, Any]], full: bool = False) -> list[str]:
    lines = ["conversation before the call"]
    if not conversation:
        lines.append("  (no user or assistant message before this call)")
    for m in conversation:
        text = m["text"] if full else shorten(m["text"], 300)
        lines.append(f"  [{m['role']}] {format_time(m['created_at'])}  {text}")
    return lines


def _message_lines(messages: list[dict[str, Any]], full: bool = False) -> list[str]:
    lines = ["messages"]
    if not messages:
        lines.append("  (none)")
    for m in messages:
        text = m["tool_output"] if m["role"] == "tool" else m["text"]
        lines.append(
            f"  [{m['role']}] {format_time(m['created_at'])}  {text if full else shorten(text, 300)}"
        )
    return lines


# --- approvals ---------------------------------------------------------------------------------


def _last_before(history: Sequence[Message], role: MessageRole, at: float) -> str:
    """The text of the session's last `role` message written no later than the call."""
    text = ""
    for m in history:
        if m.created_at <= at and m.role is role and m.text:
            text = m.text
    return text


def approval_contexts(
    source: RuntimeSource, tools: Mapping[str, Tool], pending: Sequence[PendingApproval]
) -> list[dict[str, Any]]:
    """What a person needs beside the arguments to decide each waiting call: the tool's
    description, what its effect class means, and the session's last user and assistant
    messages before the call (what was asked, what the model said it would do). One history
    read per session; texts cut (`cut_text`)."""
    histories: dict[str, Sequence[Message]] = {}
    out = []
    for p in pending:
        if p.session_id not in histories:
            try:
                histories[p.session_id] = source.runtime.store.snapshot(p.session_id)[1]
            except DexError:
                histories[p.session_id] = ()
        history = histories[p.session_id]
        tool = tools.get(p.tool_name)
        out.append(
            {
                "description": tool.description if tool is not None else "",
                "effect_meaning": traits_of(p.effect).meaning,
                "last_user": cut_text(_last_before(history, MessageRole.USER, p.requested_at))[0],
                "last_assistant": cut_text(
                    _last_before(history, MessageRole.ASSISTANT, p.requested_at)
                )[0],
            }
        )
    return out


def decision_banner(record: ToolCallRecord) -> str:
    """After a decision: who decided, and the call's status as the record holds it now (the
    call may have run, even ended, since)."""
    approval = record.approval
    if approval is None:
        return f"the call is {record.status.value}"
    return f"{approval.decision} by {approval.decided_by}; the call is now {record.status.value}"


#: What a hint names the app as when the process does not know how the person named it (a
#: worker's log); the CLI passes the `-A` value it was given.
SOME_APP = "APP"


def command_line(app: str | None, *args: str) -> str:
    """A `dex-celery` command naming the app as the person named it, quoted to run as pasted."""
    return shlex.join(["dex-celery", "-A", app or SOME_APP, *args])


def celery_line(app: str | None, *args: str) -> str:
    """The same for a `celery` command (beat, worker)."""
    return shlex.join(["celery", "-A", app or SOME_APP, *args])
