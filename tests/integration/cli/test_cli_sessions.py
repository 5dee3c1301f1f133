"""`dex-celery sessions show`: one session as one story, text and JSON (S13.6).

The session (`tests/support/apps/session_story.py`) is made by a real prefork worker: a succeeded
read, a read with a secret, an approved write, a write approved with edited arguments, an
expired approval, a write held by a write freeze until the thaw, and a budgeted write whose
worker was SIGKILLed (`outcome_unknown`, its charge held) then reconciled as gone through (spent).
The command runs in-process through click's runner against the test's `Dex`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import Result

from devtools.processes import Worker
from dex_celery import Dex
from dex_celery.tools.redact import REDACTED
from tests.support.apps.session_story import (
    ASSISTANT_TEXT,
    FREEZE_REASON,
    NOTE,
    REPORT,
    SECRET,
    SESSION,
    STORY_ENV,
    UNKNOWN_KINDS,
    USER_TEXT,
    Story,
    make_story,
)

#: An entry's line of `sessions show`: its time in UTC, then its kind.
ENTRY_LINE = re.compile(r"^  (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC)  ([a-z]+(?: [a-z]+)*)  ")


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The story's write budget, for the test process and its workers alike."""
    return {**env, **STORY_ENV}


def kinds_of(entries: list[dict[str, Any]], key: str) -> list[str]:
    return [e["kind"] for e in entries if e["call_key"] == key]


def test_sessions_show_tells_the_session_in_time_order(
    cli: Callable[..., Result],
    dex: Dex,
    start_worker: Callable[..., Worker],
    sweeper: threading.Event,
) -> None:
    """S13.6: every message, call, attempt, approval and report of the session, oldest first,
    in UTC, with secret arguments as `***` (S9.2), as JSON and as text."""
    story: Story = make_story(dex, start_worker)
    as_json = cli("sessions", "show", SESSION, "--json").output
    timeline = json.loads(as_json)
    entries = timeline["entries"]
    assert timeline["session_id"] == SESSION and timeline["open_calls"] == []
    assert [e["at"] for e in entries] == sorted(e["at"] for e in entries)
    assert all(e["time"].endswith(" UTC") for e in entries)
    assert {c["key"]: c["status"] for c in timeline["calls"]} == {
        story.read: "succeeded",
        story.secret: "succeeded",
        story.approved: "succeeded",
        story.edited: "succeeded",
        story.expired: "rejected",
        story.frozen: "succeeded",
        story.unknown: "outcome_unknown",
    }

    # The conversation first, then the calls it led to.
    assert [e["kind"] for e in entries[:3]] == ["session_opened", "user", "assistant"]
    assert (entries[1]["text"], entries[2]["text"]) == (USER_TEXT, ASSISTANT_TEXT)

    # A read: requested, claimed by a worker of a prefork pool, ended, its result told.
    assert kinds_of(entries, story.read) == [
        "call_requested",
        "attempt_claimed",
        "attempt_ended",
        "call_ended",
        "tool_result",
    ]
    claimed = next(
        e for e in entries if e["call_key"] == story.read and e["kind"] == "attempt_claimed"
    )
    assert "@" in claimed["actor"] and "pid" in claimed["summary"]

    # The one display rule: the secret is `***` in every entry.
    assert SECRET not in as_json
    requested = next(e for e in entries if e["call_key"] == story.secret)
    assert json.loads(requested["text"]) == {"query": "orders", "api_token": REDACTED}

    # An approval asked, decided by alice (with her note), then the attempt ran.
    assert kinds_of(entries, story.approved)[:3] == [
        "call_requested",
        "approval_asked",
        "approval_decided",
    ]
    decided = next(
        e for e in entries if e["call_key"] == story.approved and e["kind"] == "approval_decided"
    )
    assert (decided["actor"], decided["state"], decided["text"]) == ("alice", "approved", NOTE)
    # ... and one nobody decided in time.
    expired = next(
        e for e in entries if e["call_key"] == story.expired and e["kind"] == "approval_decided"
    )
    assert expired["state"] == "expired" and "approval deadline" in expired["summary"]
    assert "attempt_claimed" not in kinds_of(entries, story.expired)

    # An approval with edited arguments (S13.3.3): who, what changed, the audit log's digest.
    assert kinds_of(entries, story.edited)[:4] == [
        "call_requested",
        "approval_asked",
        "approval_decided",
        "approval_edited",
    ]
    edit = next(
        e for e in entries if e["call_key"] == story.edited and e["kind"] == "approval_edited"
    )
    assert edit["actor"] == "alice" and "(changed: value)" in edit["summary"]
    asked_for = next(e for e in entries if e["call_key"] == story.edited)
    assert asked_for["text"] == '{"value": 15}'  # as requested; it ran with the edit
    assert (
        "arguments digest " in edit["summary"] and edit["text"] == '{"value": 15} -> {"value": 5}'
    )

    # A write held by the freeze at its claim, then let run by bob's thaw (S13.2).
    assert kinds_of(entries, story.frozen) == [
        "call_requested",
        "held_by_freeze",
        "released_by_thaw",
        "attempt_claimed",
        "attempt_ended",
        "call_ended",
        "tool_result",
    ]
    held = next(
        e for e in entries if e["call_key"] == story.frozen and e["kind"] == "held_by_freeze"
    )
    assert held["actor"] == "ann" and held["text"] == FREEZE_REASON
    released = next(
        e for e in entries if e["call_key"] == story.frozen and e["kind"] == "released_by_thaw"
    )
    assert released["actor"] == "bob"

    # The killed write: charged to the budget, lost, outcome_unknown (its charge held), the
    # model told so, surfaced, then the report, which says it went through (spent).
    unknown = kinds_of(entries, story.unknown)
    # (The TOOL message is written with the outcome, at its end or, by the sweeper, a little
    # after it: before or after the charge held at that end.)
    assert [k for k in unknown if k != "tool_result"] == UNKNOWN_KINDS, unknown
    assert unknown.index("call_ended") < unknown.index("tool_result") < unknown.index("report")
    moves = [
        e["state"]
        for e in entries
        if e["call_key"] == story.unknown and e["kind"].startswith("budget")
    ]
    assert moves == ["reserved", "held", "spent"]
    by_kind = {e["kind"]: e for e in entries if e["call_key"] == story.unknown}
    assert by_kind["attempt_ended"]["state"] == "lost"
    assert by_kind["call_ended"]["state"] == "outcome_unknown"
    assert "OUTCOME UNKNOWN" in by_kind["tool_result"]["text"]
    assert by_kind["report"]["text"] == f"{REPORT} (tool call {story.unknown})"
    assert entries[-1] == by_kind["report"]

    text = cli("sessions", "show", SESSION).output
    print(text)  # TEMP
    assert text.splitlines()[0] == f"session   {SESSION}"
    assert SECRET not in text
    for needle in (
        USER_TEXT,
        "approved by alice  (t2/refund)",
        NOTE,
        "outcome_unknown after 1 attempt",
        "arguments edited by alice when approving",
        "held by a write freeze of every tool (frozen by ann",
        "budget refunds: spent (reconciled: went_through)",
        REPORT,
    ):
        assert needle in text, needle
    # Times in UTC, one entry per line, in the JSON's order.
    lines = [m for line in text.splitlines() if (m := ENTRY_LINE.match(line))]
    assert [m.group(2).replace(" ", "_") for m in lines] == [e["kind"] for e in entries]
    assert [m.group(1) for m in lines] == [e["time"] for e in entries]


def test_unknown_and_odd_session_ids_are_one_error_line(
    cli: Callable[..., Result], dex: Dex
) -> None:
    """S9.3: no such session, or an id no call could have: a typed error, exit 1, one line."""
    for session_id, says in (
        ("no-such-session", "no session 'no-such-session'"),
        ("bell\x07id", "contains control characters"),
        ("a/b", "ambiguous"),
        (" padded", "leading or trailing spaces"),
        ("x" * 201, "the limit is 200"),
    ):
        result = cli("sessions", "show", session_id, code=1)
        (line,) = result.output.strip().splitlines()
        assert line.startswith("error: ") and says in line, line
    # A session with no call yet is a story too: opened, and its messages.
    dex.client().open_session("ünïcode ☃ only")
    dex.client().send_user_message("ünïcode ☃ only", "hello")
    quiet = json.loads(cli("sessions", "show", "ünïcode ☃ only", "--json").output)
    assert [e["kind"] for e in quiet["entries"]] == ["session_opened", "user"]
    assert (
        quiet["calls"] == [] and quiet["path"] == "/sessions/%C3%BCn%C3%AFcode%20%E2%98%83%20only"
    )
