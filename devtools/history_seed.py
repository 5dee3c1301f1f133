"""Old history written in bulk straight to SQL, for the retention tests and bench.retention.

Each session gets one user message and `per_session` ended calls, each call its TOOL message;
the ended calls are added to `dex_call_counts` as the store's writers add them, so the counts
still equal a grouped scan. Rows are inserted in chunks (one transaction each), so a million
calls take seconds, not the hours real requests would.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, insert

from dex_celery.model.policy import EffectClass, ToolPolicy, resolve_policy
from dex_celery.settings import Settings
from dex_celery.store.counts import count_ended
from dex_celery.store.hot import hot_statements
from dex_celery.store.schema import messages, sessions, tool_calls

#: Rows per INSERT transaction.
CHUNK = 5_000
STATUSES = ("succeeded", "failed", "rejected")


def call_row(
    key: str, *, requested_at: float, status: str, tool: str = "echo", **extra: Any
) -> dict[str, Any]:
    """A `dex_tool_calls` row of an ended `read` call (override any column with `extra`)."""
    session_id, turn_id, call_id = key.split("/")
    policy = resolve_policy(ToolPolicy(effect=EffectClass.READ), None, None, Settings())
    return {
        "key": key,
        "session_id": session_id,
        "turn_id": turn_id,
        "tool_call_id": call_id,
        "tool_name": tool,
        "arguments": json.dumps({"q": key}),
        "sealed_arguments": None,
        "effect": policy.effect.value,
        "requires_approval": 0,
        "policy": policy.to_json(),
        "status": status,
        "error": None if status == "succeeded" else f"{status} long ago",
        "result": '"ok"' if status == "succeeded" else None,
        "attempts": 1,
        "attempt_log": json.dumps(
            [
                {
                    "attempt": 1,
                    "state": "ok",
                    "owner": "w1",
                    "claimed_at": requested_at,
                    "ended_at": requested_at + 1,
                }
            ]
        ),
        "late_result": None,
        "ledger_epoch": "e1",
        "claim_fence": None,
        "claimed_attempt": None,
        "claimed_at": None,
        "claimed_by": None,
        "requested_at": requested_at,
        "finished_at": requested_at + 1,
        "approval_deadline": None,
        "decision": None,
        "decided_by": None,
        "decided_at": None,
        "decision_note": None,
        "repeat_digest": None,
        "repeat_of": None,
        "repeat_reason": None,
        "trace_context": None,
        **extra,
    }


def tool_message(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "session_id": row["session_id"],
        "role": "tool",
        "text": None,
        "tool_output": row["result"] or row["error"],
        "turn_id": row["turn_id"],
        "tool_call_id": row["tool_call_id"],
        "tool_name": row["tool_name"],
        "tool_arguments": row["arguments"],
        "call_key": row["key"],
        "created_at": row["finished_at"],
    }


def write_calls(engine: Engine, rows: list[dict[str, Any]], *, user_messages: bool = True) -> None:
    """Insert ended calls (with their sessions, a user message per new session and each call's
    TOOL message) and count them, in one transaction."""
    with engine.begin() as conn:
        first: dict[str, float] = {}
        for row in rows:
            first.setdefault(row["session_id"], row["requested_at"])
        conn.execute(
            insert(sessions),
            [{"id": s, "default_effect": None, "created_at": t} for s, t in first.items()],
        )
        if user_messages:
            conn.execute(
                insert(messages),
                [
                    {"session_id": s, "role": "user", "text": "hello", "created_at": t}
                    for s, t in first.items()
                ],
            )
        conn.execute(insert(tool_calls), rows)
        ended = [r for r in rows if r["status"] not in ("pending", "awaiting_approval")]
        conn.execute(insert(messages), [tool_message(r) for r in ended])
        count_ended(
            conn,
            hot_statements(engine),
            [(r["tool_name"], r["effect"], r["status"], r["attempts"]) for r in ended],
        )


def seed_history(
    engine: Engine,
    *,
    count: int,
    requested_at: float,
    per_session: int = 10,
    prefix: str = "old",
    progress: bool = False,
) -> None:
    """`count` ended calls requested at `requested_at` (a microsecond apart), `per_session` to a
    session, in sessions `<prefix>-<n>`."""
    for base in range(0, count, CHUNK):
        rows = [
            call_row(
                f"{prefix}-{i // per_session:08d}/t{i % per_session}/c",
                requested_at=requested_at + i * 1e-6,
                status=STATUSES[i % len(STATUSES)],
            )
            for i in range(base, min(count, base + CHUNK))
        ]
        write_calls(engine, rows)
        if progress and (base // CHUNK) % 20 == 0:
            print(f"  seeded {base + len(rows):,} calls", flush=True)
