"""Approvals bound to what was approved (docs/guardrails.md, S13.3.1-S13.3.5): real prefork
workers of `tests.support.apps.refund_worker` (two releases of one `refund` tool), a real
redis-server, and both SQLite and the running PostgreSQL. Each test judges from the tool's own
side-effect log (`refund_app.refunds`), the record, and what the model reads."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from devtools.processes import CeleryWorker, wait_for
from devtools.toolapp import LOG_ENV
from dex_celery import CallStatus, Dex, InvalidEdit, MessageRole, Settings
from dex_celery.cli.main import EXIT_REFUSED, main
from dex_celery.engine.steps import AttemptMessage
from dex_celery.integrations.frameworks.calls import pending_text, record_text
from dex_celery.model.approval_binding import ApprovalEdit
from dex_celery.model.records import ApprovalDecision
from dex_celery.ops.timeline import EntryKind, session_timeline
from dex_celery.store.approval_binding import ArgumentsEdit
from tests.support.apps import cliapp
from tests.support.apps.refund_app import RELEASE_ENV, make_app, refunds
from tests.support.processes.workers import each_stopped
from tests.support.stores.databases import ON_BOTH_DATABASES

pytestmark = [
    pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning"),
    ON_BOTH_DATABASES,
]


@pytest.fixture
def release(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Dex]:
    """A requester (or approver) of release `1` or `2`, on the test's backends."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    made: dict[str, Dex] = {}

    def build(which: str) -> Dex:
        if which not in made:
            made[which] = make_app(Settings.from_env(env), which)[1]
            made[which].store.create_schema()
        return made[which]

    return build


@pytest.fixture
def refund_worker(env: dict[str, str]) -> Iterator[Callable[[str], CeleryWorker]]:
    """A prefork worker of release `1` or `2` of the refund app."""

    def start(which: str) -> CeleryWorker:
        return CeleryWorker(
            "tests.support.apps.refund_worker:app",
            {**env, RELEASE_ENV: which},
            Path(env[LOG_ENV]),
            concurrency=2,
        ).start()

    yield from each_stopped(start)


def tool_messages(dex: Dex, key: str) -> list[str]:
    session, turn, call = key.split("/")
    history = dex.client().get_agent_snapshot(session).messages
    return [
        m.tool_output or ""
        for m in history
        if m.role is MessageRole.TOOL and m.turn_id == turn and m.tool_call_id == call
    ]


def cli(dex: Dex, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.setattr(cliapp, "dex", dex)
    return CliRunner().invoke(main, ["--app", "tests.support.apps.cliapp:dex", "approvals", *args])


def test_redeployed_tool_waits_again_and_says_why(
    release: Callable[[str], Dex],
    refund_worker: Callable[[str], CeleryWorker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S13.3.2: a call approved under release 1 whose tool is redeployed (release 2, another
    schema) before a worker claims it does not run: the release-2 worker withdraws its attempt
    and the call waits again, with the reason in the record, `approvals list`, the pending
    listing, the events stream and the model's text. Approved again, it runs exactly once."""
    first = release("1")
    worker = refund_worker("1")
    worker.stop()  # the first release is gone: nothing claims the approved call under it
    record = first.client().request_call(
        "s1", "t1", "c1", "refund", {"order": "o-1", "amount_cents": 500, "card": "4111"}
    )
    assert record.status is CallStatus.AWAITING_APPROVAL
    assert record.definition_digest and record.arguments_digest
    approved = first.client().approve(record.key, "alice", "customer called")
    assert approved.status is CallStatus.PENDING and approved.approved_digest

    refund_worker("2")
    wait_for(
        lambda: first.store.get_call(record.key).status is CallStatus.AWAITING_APPROVAL,  # type: ignore[union-attr]
        timeout=45,
        what="the approved call to wait again",
    )
    waiting = first.store.get_call(record.key)
    assert waiting is not None
    assert refunds("o-1") == []
    reason = waiting.rewait_reason or ""
    assert "approved by alice" in reason and "changed" in reason, reason
    assert "a deploy" in reason and "did not run" in reason, reason
    assert waiting.approval is None and waiting.approved_digest is None
    assert waiting.definition_digest != record.definition_digest
    assert waiting.approval_deadline is not None
    assert first.ledger.read(record.key) is None, "the withdrawn attempt left a ledger entry"
    # Everywhere it is shown.
    (pending,) = first.client().pending_approvals()
    assert pending.key == record.key and pending.waits_again == reason
    listed = cli(first, monkeypatch, "list")
    assert listed.exit_code == 0 and f"waits again: {reason}" in listed.output
    assert json.loads(cli(first, monkeypatch, "list", "--json").output)[0]["waits_again"] == reason
    assert reason in pending_text(waiting)
    entries: Any = first.ledger.client.xrange(first.keys.events)
    told = [f for _, f in entries if f.get("key") == record.key]
    assert told[-1]["type"] == "tool_call_awaiting_approval" and told[-1]["reason"] == reason
    # The session's timeline (S13.6): approved by alice, then sent back to wait, saying why.
    story = session_timeline(first, "s1")
    kinds = [e.kind for e in story.entries if e.call_key == record.key]
    assert kinds.count(EntryKind.APPROVAL_ASKED_AGAIN) == 1, kinds
    (again_entry,) = [e for e in story.entries if e.kind is EntryKind.APPROVAL_ASKED_AGAIN]
    assert reason in again_entry.summary and again_entry.state == "awaiting_approval"

    # Approved again (from the new release): bound to the new definition, it runs once.
    second = release("2")
    again = second.client().approve(record.key, "bob")
    (done,) = second.client().wait([again.key], timeout=45)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert refunds("o-1") == [f"refund {record.key} 500 EUR 11"]
    assert done.approval_used_at is not None


def test_edited_approval_runs_the_edited_arguments_once_and_the_model_reads_it(
    release: Callable[[str], Dex], refund_worker: Callable[[str], CeleryWorker]
) -> None:
    """S13.3.3, S13.3.4: the approver lowers the amount and keeps the secret card (`***`); the
    tool runs once with the edit (its own log), the record keeps who, before and after (card
    `***`), and the model's TOOL message, in the history and in a framework's result, says
    the arguments were edited. A copy of the attempt's message delivered again runs nothing
    (the approval is consumed once)."""
    dex = release("1")
    refund_worker("1")
    record = dex.client().request_call(
        "s2", "t1", "c1", "refund", {"order": "o-2", "amount_cents": 500, "card": "4111"}
    )
    edit = {"order": "o-2", "amount_cents": 300, "card": "***"}
    dex.client().approve(record.key, "alice", edit=json.dumps(edit))
    (done,) = dex.client().wait([record.key], timeout=45)
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert refunds("o-2") == [f"refund {record.key} 300 EUR 11"]
    change = done.approval_edit
    assert change is not None and change.by == "alice"
    assert change.before == {"order": "o-2", "amount_cents": 500, "card": "***"}
    assert change.after == {"order": "o-2", "amount_cents": 300, "card": "***"}
    assert json.loads(done.arguments)["amount_cents"] == 300
    (message,) = tool_messages(dex, record.key)
    assert message.startswith("Note: alice edited the arguments"), message
    assert '"amount_cents": 300' in message and '"amount_cents": 500' in message
    assert "4111" not in message
    assert record_text(done) == message

    # The same attempt delivered again (a resumed run, a retried gate): nothing runs twice.
    dex.runtime.steps.publish(
        AttemptMessage(
            "refund", record.key, json.loads(done.arguments), done.policy, done.sealed_arguments,
            approved=True,
        ),
        attempt=1,
    )  # fmt: skip
    wait_for(
        lambda: int(dex.ledger.client.hget(dex.keys.call(record.key), "refused") or 0) >= 1,
        timeout=30,
        what="the repeated delivery to be refused",
    )
    assert refunds("o-2") == [f"refund {record.key} 300 EUR 11"]


def test_a_bad_edit_is_refused_and_stores_nothing(
    release: Callable[[str], Dex], monkeypatch: pytest.MonkeyPatch
) -> None:
    """S13.3.3: an edit the tool's schema refuses (a word for an integer, an unknown argument,
    not JSON, not an object) raises `InvalidEdit` (the CLI: one `error:` line, exit 1) and
    leaves the call exactly as it was, still waiting, with nothing published."""
    dex = release("1")
    record = dex.client().request_call(
        "s3", "t1", "c1", "refund", {"order": "o-3", "amount_cents": 500}
    )
    events_before = dex.ledger.client.xlen(dex.keys.events)
    for bad in (
        {"order": "o-3", "amount_cents": "lots"},
        {"order": "o-3", "amount_cents": 1, "extra": True},
        "{not json",
        "[1, 2]",
    ):
        with pytest.raises(InvalidEdit):
            dex.client().approve(record.key, "mallory", edit=bad)
        assert dex.store.get_call(record.key) == record
    out = cli(dex, monkeypatch, "approve", record.key, "--by", "bob", "--edit", "{bad")
    assert out.exit_code == EXIT_REFUSED
    assert out.output.startswith("error: ") and out.output.count("\n") == 1, out.output
    assert dex.store.get_call(record.key) == record
    assert dex.ledger.read(record.key) is None
    assert dex.ledger.client.xlen(dex.keys.events) == events_before
    # A good edit from the command line: approved with it, recorded.
    good = '{"order": "o-3", "amount_cents": 450}'
    out = cli(dex, monkeypatch, "approve", record.key, "--by", "bob", "--edit", good)
    assert out.exit_code == 0 and "with edited arguments" in out.output, out.output
    edited = dex.store.get_call(record.key)
    assert edited is not None and edited.status is CallStatus.PENDING
    assert edited.approval_edit is not None and edited.approval_edit.by == "bob"
    assert edited.approval_edit.after == {"order": "o-3", "amount_cents": 450}


def test_an_approval_is_consumed_once_in_the_write_fence(release: Callable[[str], Dex]) -> None:
    """S13.3.1, S13.3.5 in SQL: the claim holds only with the approved binding, consumes the
    approval and claims the write in one update; a second attempt's claim with the same binding
    is refused, and so is any claim with another binding, and a call that was claimed never
    waits again."""
    dex = release("1")
    store = dex.store
    record = dex.client().request_call(
        "s4", "t1", "c1", "refund", {"order": "o-4", "amount_cents": 5}
    )
    now = store.clock()
    decision = ApprovalDecision("approved", "alice", now, None)
    change = ApprovalEdit("alice", now, {"amount_cents": 5}, {"amount_cents": 4}).to_json()
    edit = ArgumentsEdit('{"amount_cents":4,"order":"o-4"}', None, "d" * 64, change)
    assert store.approve_bound(
        record.key, decision, now=now, epoch=None, binding="b" * 64, edit=edit
    )
    claim = dict(attempt=1, owner="w", now=now, fenced=True)
    assert not store.claim_approved(record.key, fence="f1", binding="x" * 64, **claim).ok
    held = store.claim_approved(record.key, fence="f1", binding="b" * 64, **claim)
    assert held.ok and held.edit == change
    assert not store.claim_approved(record.key, fence="f2", binding="b" * 64, **claim).ok
    claimed = store.get_call(record.key)
    assert claimed is not None and claimed.approval_used_at == now
    assert claimed.claimed_by == "w" and claimed.arguments == edit.arguments
    assert not store.rewait(
        record.key,
        approved="b" * 64,
        reason="r",
        deadline=now + 60,
        definition_digest="e" * 64,
        arguments_digest=None,
    )
