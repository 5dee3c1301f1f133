"""The repeat guard (S5.4) against a real redis-server and both SQLite and the running PostgreSQL.

No worker runs here: what the guard judges is the earlier call's record (and the running lease of
a fenced attempt in the ledger), so each earlier state is made the way the system makes it, and
the crash tests (`tests/crash/worker/test_repeat_guard.py`) reproduce the issue with real workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from devtools.processes import wait_for
from devtools.toolapp import make_app
from dex_celery import CallStatus, Dex, EffectClass, Settings, ToolContext, ToolPolicy
from dex_celery.engine.request.approvals import expire_approval
from dex_celery.model.records import ToolCallRecord
from dex_celery.ops.present import call_details, render_details
from dex_celery.ops.webhooks import WebhookEvent, WebhookSender
from dex_celery.store.schema import repeat_guards, tool_calls
from dex_celery.store.values import Outcome
from dex_celery.web.app import WebApp
from dex_celery.web.auth import Credentials
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]

RUNNING = "may still be running"
UNRECONCILED = "may have taken effect; its outcome is not reconciled yet"


def _write(ctx: ToolContext, **arguments: Any) -> Any:
    return "ok"


@pytest.fixture
def guarded(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dex:
    """The test tool app plus tools with the guard's per-policy settings."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _app, dex = make_app(Settings.from_env(env))
    write = ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False)
    dex.tool(name="remind", policy=write)(_write)
    dex.tool(
        name="remind_windowed",
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, repeat_window=600
        ),
    )(_write)
    dex.tool(
        name="unguarded_write",
        policy=ToolPolicy(
            effect=EffectClass.NON_IDEMPOTENT_WRITE, requires_approval=False, repeat_guard=False
        ),
    )(_write)
    dex.tool(
        name="guarded_idempotent",
        policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE, repeat_guard=True),
    )(_write)
    dex.tool(name="put_order", policy=ToolPolicy(effect=EffectClass.IDEMPOTENT_WRITE))(_write)
    dex.register_outcome_check("charge_order", lambda key, arguments: f"{key} was charged once")
    dex.store.create_schema()
    return dex


def _request(
    dex: Dex,
    turn: str,
    tool: str = "charge_order",
    session: str = "s1",
    call: str = "c1",
    **args: Any,
) -> ToolCallRecord:
    arguments = args or {"order": "A-1"}
    return dex.client().request_call(session, turn, call, tool, arguments)


def _events(dex: Dex, type_: str, key: str) -> list[dict[str, str]]:
    entries: Any = dex.ledger.client.xrange(dex.keys.events)
    return [f for _id, f in entries if f.get("type") == type_ and f.get("key") == key]


def _end(dex: Dex, record: ToolCallRecord, status: CallStatus, **kw: Any) -> None:
    assert dex.store.record_outcome(record.key, Outcome(status, kw.pop("error", "ended"), **kw))


def _guard_rows(dex: Dex) -> int:
    with dex.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(repeat_guards)).scalar_one())


def test_a_repeat_of_a_call_in_flight_waits_for_a_person_and_says_why(guarded: Dex) -> None:
    """S5.4: the policy needs no approval, yet the identical turn-2 call waits, and the record,
    the approval listing, `calls show`, the web page's value and the webhook name the earlier
    call and the reason; an event announces it."""
    first = _request(guarded, "t1")
    assert first.status is CallStatus.PENDING and first.repeat_of is None
    second = _request(guarded, "t2")
    assert second.status is CallStatus.AWAITING_APPROVAL
    assert second.repeat_of == first.key
    assert second.repeat_reason == f"an identical call {first.key} {RUNNING}"
    assert second.approval_deadline is not None

    (held,) = _events(guarded, "tool_call_repeat_held", second.key)
    assert held["earlier"] == first.key and RUNNING in held["reason"]
    (awaiting,) = _events(guarded, "tool_call_awaiting_approval", second.key)
    assert awaiting["repeat_of"] == first.key

    (pending,) = guarded.client().pending_approvals()
    assert pending.key == second.key and pending.repeat is not None
    assert pending.repeat.earlier == first.key and RUNNING in pending.repeat.reason
    assert pending.as_dict()["repeat"]["earlier_status"] == "pending"

    details = call_details(guarded, guarded.store.get_call(second.key) or second)
    assert details["repeat"]["repeat_of"] == first.key
    shown = render_details(details)
    assert f"held back: an identical call {first.key} {RUNNING}" in shown

    sender = WebhookSender(guarded, urls=["http://127.0.0.1:9/hook"])
    (event,) = [e for e in guarded.events.read() if e.type == "tool_call_awaiting_approval"]
    body = sender._body(WebhookEvent.AWAITING_APPROVAL, event)
    assert body["repeat_of"] == first.key and RUNNING in body["repeat_reason"]


def test_other_arguments_other_sessions_and_unguarded_classes_pass(guarded: Dex) -> None:
    """Only the same tool with the same canonical arguments in the same session is a repeat;
    reads and idempotent writes skip the guard (no slot is written for them)."""
    _request(guarded, "t1")
    assert _request(guarded, "t2", order="A-2").status is CallStatus.PENDING
    assert _request(guarded, "t3", session="s2").status is CallStatus.PENDING
    slots = _guard_rows(guarded)
    for turn in ("t4", "t5"):
        for tool, args in (
            ("echo", {"text": "same"}),
            ("put_order", {"order": "A-1"}),
            ("unguarded_write", {"order": "A-1"}),
        ):
            record = _request(guarded, turn, tool, call=tool, **args)
            assert record.status is CallStatus.PENDING, record
    assert _guard_rows(guarded) == slots


def test_an_idempotent_write_can_opt_in(guarded: Dex) -> None:
    _request(guarded, "t1", "guarded_idempotent", order="A-1")
    second = _request(guarded, "t2", "guarded_idempotent", order="A-1")
    assert second.status is CallStatus.AWAITING_APPROVAL and second.repeat_of is not None


def test_an_unreconciled_unknown_outcome_holds_until_it_is_reconciled(guarded: Dex) -> None:
    """S5.4 + S8: repeating an `outcome_unknown` write waits until it is reconciled; the
    reconciliation is announced to the waiting call and shown on its approval."""
    first = _request(guarded, "t1")
    _end(guarded, first, CallStatus.OUTCOME_UNKNOWN, error="the worker was lost")
    second = _request(guarded, "t2")
    assert second.status is CallStatus.AWAITING_APPROVAL
    assert second.repeat_reason == f"an identical call {first.key} {UNRECONCILED}"

    earlier = guarded.store.get_call(first.key)
    assert earlier is not None
    guarded.runtime.reconciler.reconcile_call(earlier, "")
    (evidence,) = _events(guarded, "tool_call_repeat_evidence", second.key)
    assert evidence == {**evidence, "earlier": first.key, "evidence": "reconciled"}
    (pending,) = guarded.client().pending_approvals()
    assert pending.repeat is not None and pending.repeat.reconciled
    assert "reconciled" in pending.repeat.now_text

    # Reconciled: the earlier call is no longer a hazard, and the next identical call passes.
    assert _request(guarded, "t3").status is CallStatus.PENDING


def test_a_timed_out_call_holds_while_its_fenced_attempt_holds_its_running_lease(
    guarded: Dex,
) -> None:
    """S5.1 + S5.4: a `failed` call whose fenced attempt still runs (its running lease in the
    ledger, no late result) holds repeats; once the lease is gone, or with a late result, it
    does not."""
    first = _request(guarded, "t1")
    running = guarded.keys.running(first.key)
    guarded.ledger.client.set(running, "1", px=60_000)
    _end(guarded, first, CallStatus.FAILED, error="the tool ran past its start-to-close timeout")
    second = _request(guarded, "t2")
    assert second.repeat_reason == f"an identical call {first.key} {RUNNING}"

    guarded.ledger.client.delete(running)  # the worker died: its lease lapsed
    assert _request(guarded, "t3").status is CallStatus.PENDING


def test_a_late_result_releases_the_guard(guarded: Dex) -> None:
    first = _request(guarded, "t1")
    guarded.ledger.client.set(guarded.keys.running(first.key), "1", px=60_000)
    _end(guarded, first, CallStatus.FAILED, error="timed out")
    guarded.store.record_late_result(first.key, json.dumps({"attempt": 1, "payload": "ok"}))
    assert _request(guarded, "t2").status is CallStatus.PENDING


def test_ended_calls_do_not_hold_without_a_window(guarded: Dex) -> None:
    """A succeeded, rejected or plainly failed earlier call does not hold a repeat: sending the
    same reminder twice can be intended."""
    for i, status in enumerate((CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.REJECTED)):
        first = _request(guarded, f"a{i}", "remind")
        _end(guarded, first, status)
        assert _request(guarded, f"b{i}", "remind").status is CallStatus.PENDING
        _end(guarded, guarded.store.get_call(f"s1/b{i}/c1") or first, CallStatus.SUCCEEDED)


def test_the_repeat_window_holds_a_repeat_of_a_recent_success(guarded: Dex) -> None:
    first = _request(guarded, "t1", "remind_windowed")
    _end(guarded, first, CallStatus.SUCCEEDED, result='"ok"')
    second = _request(guarded, "t2", "remind_windowed")
    assert second.status is CallStatus.AWAITING_APPROVAL
    assert second.repeat_of == first.key and "succeeded" in (second.repeat_reason or "")
    assert json.loads(second.policy.to_json())["repeat_window"] == 600


def test_a_held_call_past_its_deadline_tells_the_model_the_earlier_may_have_taken_effect(
    guarded: Dex,
) -> None:
    first = _request(guarded, "t1")
    second = _request(guarded, "t2")
    assert expire_approval(
        guarded.store, guarded.ledger, second, (second.approval_deadline or 0) + 1
    )
    ended = guarded.store.get_call(second.key)
    assert ended is not None and ended.status is CallStatus.REJECTED
    error = ended.error or ""
    assert "approval deadline passed" in error
    assert first.key in error and "may have taken effect" in error
    assert "do not assume it failed or that calling again is safe" in error


def test_a_person_rejecting_a_held_call_tells_the_model_too(guarded: Dex) -> None:
    first = _request(guarded, "t1")
    second = _request(guarded, "t2")
    rejected = guarded.client().reject(second.key, "ana", "duplicate")
    assert "rejected by ana: duplicate" in (rejected.error or "")
    assert first.key in (rejected.error or "") and "may have taken effect" in (rejected.error or "")


def test_an_approved_repeat_becomes_the_call_later_repeats_are_judged_against(
    guarded: Dex,
) -> None:
    first = _request(guarded, "t1")
    second = _request(guarded, "t2")
    guarded.client().approve(second.key, "ana", "the first one failed at the bank")
    _end(guarded, first, CallStatus.FAILED)  # the first one is over
    third = _request(guarded, "t3")
    assert third.status is CallStatus.AWAITING_APPROVAL and third.repeat_of == second.key


def test_same_ids_again_is_the_same_call_not_a_repeat(guarded: Dex) -> None:
    """S2.3 still holds: requesting the same (session, turn, call) returns the call as is."""
    first = _request(guarded, "t1")
    again = _request(guarded, "t1")
    assert again.key == first.key and again.status is CallStatus.PENDING and again.repeat_of is None


def test_secret_values_are_compared_by_keyed_digest_never_in_clear(guarded: Dex) -> None:
    """Same card: a repeat; another card: not one. Neither card is stored in the digest."""
    card = "4111111111111111"
    first = guarded.client().request_call("s1", "t1", "c1", "guarded_secret", {"card": card})
    same = guarded.client().request_call("s1", "t2", "c1", "guarded_secret", {"card": card})
    other = guarded.client().request_call("s1", "t3", "c1", "guarded_secret", {"card": "5500"})
    assert same.repeat_of == first.key
    assert other.repeat_of is None
    with guarded.store.engine.connect() as conn:
        rows = conn.execute(select(repeat_guards)).all()
        digests = conn.execute(select(tool_calls.c.repeat_digest)).scalars().all()
    assert len(rows) == 2
    assert all(card not in str(r) for r in rows) and all(card not in (d or "") for d in digests)


# --- two requesters racing in two processes ----------------------------------------------------

_REQUESTER = """
import json, os, sys, time
from pathlib import Path
from dex_celery import Settings
from dex_celery.engine.request.dispatch import CallRequest
from devtools.toolapp import make_app
_app, dex = make_app(Settings.from_env(dict(os.environ)))
client = dex.client()
go = Path(sys.argv[1])
client.request_call("warm", sys.argv[2], "c0", "echo", {"text": "warm"})
Path(sys.argv[1] + "." + sys.argv[2]).touch()
while not go.exists():
    time.sleep(0.001)
out = {}
for i in range(int(sys.argv[3])):
    r = client.request_call(f"race-{i}", sys.argv[2], "c1", "charge_order", {"order": f"R-{i}"})
    out[r.key] = [r.status.value, r.repeat_of]
print(json.dumps(out))
"""


def test_two_requesters_racing_in_two_processes_one_passes_one_waits(
    guarded: Dex, env: dict[str, str], tmp_path: Path
) -> None:
    """Two real requester processes send the identical call at the same instant, session after
    session: in every session exactly one passes and the other waits, naming the one that
    passed (the slot's insert or compare-and-set decides, S5.4)."""
    sessions = 25
    go = tmp_path / "go"
    root = Path(__file__).resolve().parents[3]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REQUESTER, str(go), name, str(sessions)],
            env={**os.environ, **env, "PYTHONPATH": str(root)},
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("ta", "tb")
    ]
    wait_for(
        lambda: all(
            Path(f"{go}.{n}").exists() or p.poll() is not None
            for n, p in zip(("ta", "tb"), procs, strict=True)
        ),
        timeout=60,
        what="both requesters ready",
    )
    go.touch()
    results: dict[str, list[Any]] = {}
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.update(json.loads(out))
    for i in range(sessions):
        a, b = results[f"race-{i}/ta/c1"], results[f"race-{i}/tb/c1"]
        statuses = sorted([a[0], b[0]])
        assert statuses == ["awaiting_approval", "pending"], (i, a, b)
        passed, held = (a, b) if a[0] == "pending" else (b, a)
        passed_key = f"race-{i}/{'ta' if passed is a else 'tb'}/c1"
        assert passed[1] is None and held[1] == passed_key
        stored = guarded.store.get_call(passed_key)
        assert stored is not None and stored.status is CallStatus.PENDING


def test_the_web_pages_say_why_a_held_call_waits(guarded: Dex) -> None:
    """S5.4: the approvals page and the call's page show the reason and link the earlier call."""
    first = _request(guarded, "t1")
    second = _request(guarded, "t2")
    app = WebApp(guarded, Credentials.from_settings(Settings(web_users="alice:pw-a")))
    client = TestClient(app.build(), base_url="http://localhost", follow_redirects=False)
    signed = client.post("/login", data={"name": "alice", "password": "pw-a", "next": "/"})
    assert signed.status_code == 303
    for path in ("/approvals", f"/calls/{second.key}"):
        page = client.get(path)
        assert page.status_code == 200
        assert f"an identical call {first.key} {RUNNING}" in page.text, path
        assert f'href="/calls/{first.key}"' in page.text, path
