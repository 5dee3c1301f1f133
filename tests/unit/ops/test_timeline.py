"""The timeline's assembly, without a database (S13.6): one time order whatever source an entry
comes from, the same instant written at two precisions kept in causal order, a new source
joining by being listed, the page's address of a session with any valid id, and the one setting
that names the web app's address on a call's spans."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from dex_celery.audit.entries import digest
from dex_celery.errors import ConfigurationError
from dex_celery.model.approval_binding import ApprovalEdit
from dex_celery.model.budgets import Budget, charge_of, charges_json
from dex_celery.model.freeze import ALL_TOOLS, FreezeMode, WriteFreeze
from dex_celery.model.links import session_path, session_url
from dex_celery.model.outcomes import CallStatus
from dex_celery.model.policy import EffectClass
from dex_celery.model.records import ApprovalDecision, SessionRecord, ToolCallRecord
from dex_celery.ops.timeline import (
    SOURCES,
    Entry,
    EntryKind,
    SessionFacts,
    _same_instant,
    assemble,
)
from dex_celery.settings import Settings
from dex_celery.store.freezes import FreezeHold
from tests.support.stores.call_records import call_record

FACTS = SessionFacts(
    session=SessionRecord("s", EffectClass.READ, 100.0),
    calls=(),
    messages=(),
    ledger={},
    unknowns=(),
    checked_tools=frozenset(),
    full=False,
)


def test_entries_of_every_source_are_in_one_time_order_and_ties_in_causal_order() -> None:
    def late(facts: SessionFacts) -> Iterator[Entry]:
        yield Entry(103.0, EntryKind.CALL_ENDED, "ended", call_key="s/t/c")
        yield Entry(103.0, EntryKind.ATTEMPT_ENDED, "attempt ended", call_key="s/t/c")
        yield Entry(101.0, EntryKind.CALL_REQUESTED, "requested", call_key="s/t/c")

    def early(facts: SessionFacts) -> Iterator[Entry]:
        yield Entry(100.5, EntryKind.USER, "asked")

    entries = assemble(FACTS, (*SOURCES, late, early))
    assert [e.kind for e in entries] == [
        EntryKind.SESSION_OPENED,
        EntryKind.USER,
        EntryKind.CALL_REQUESTED,
        EntryKind.ATTEMPT_ENDED,
        EntryKind.CALL_ENDED,
    ]
    assert entries[0].text == "default effect class: read"
    assert entries[2].call_name == "t/c" and entries[0].call_name is None
    assert entries[1].as_dict()["time"] == "1970-01-01 00:01:40.500 UTC"


def test_an_attempt_end_logged_at_lower_precision_is_the_call_end() -> None:
    """The ledger's log has 14 digits, the call's end 17: 0.05 ms apart is one instant."""
    finished = 1796472300.1234567
    assert _same_instant(finished + 0.00005, finished) == finished
    assert _same_instant(finished + 0.01, finished) == finished + 0.01
    assert _same_instant(finished - 1.0, finished) == finished - 1.0
    assert _same_instant(finished + 0.00005, None) == finished + 0.00005


def test_a_session_page_names_any_valid_session_id_exactly() -> None:
    assert session_path("s1") == "/sessions/s1"
    assert session_path("Köln · 1002?x=1 %") == "/sessions/K%C3%B6ln%20%C2%B7%201002%3Fx%3D1%20%25"
    assert session_url(None, "s1") is None
    assert session_url("https://dex.example.com/ops/", "a b") == (
        "https://dex.example.com/ops/sessions/a%20b"
    )


@pytest.mark.parametrize(
    "url",
    ["dex.example.com", "ftp://dex.example.com", "https://x/?q=1", "https://x/#f", "https://"],
)
def test_the_web_base_url_must_be_an_http_address(url: str) -> None:
    with pytest.raises(ConfigurationError, match="web_base_url"):
        Settings(web_base_url=url)
    assert Settings(web_base_url="https://dex.example.com:8443/ops").web_base_url


def test_a_write_freeze_joins_the_timeline_as_one_more_source() -> None:
    """S13.6.5 with S13.2: a call held at its claim, then released by a thaw."""
    freeze = WriteFreeze(1, ALL_TOOLS, FreezeMode.HOLD, "incident 42", "ann", 102.0, "bob", 104.0)
    facts = replace(FACTS, holds=(FreezeHold("s/t/c", freeze, 103.0, 104.5),))
    held, released = assemble(facts)[1:]
    assert (held.kind, held.at, held.actor, held.text) == (
        EntryKind.HELD_BY_FREEZE,
        103.0,
        "ann",
        "incident 42",
    )
    assert "write freeze of every tool" in held.summary and held.call_name == "t/c"
    assert (released.kind, released.at, released.actor) == (
        EntryKind.RELEASED_BY_THAW,
        104.5,
        "bob",
    )


def _call(**fields: object) -> ToolCallRecord:
    """A write of the session `s`, requested at 101."""
    base: dict[str, object] = dict(
        status=CallStatus.SUCCEEDED,
        tool_name="refund",
        arguments='{"amount":300,"card":"***"}',
        result='"ok"',
        attempts=1,
        requested_at=101.0,
        finished_at=105.0,
    )
    return call_record(**{**base, **fields})


def _refunds(limit: int = 2) -> str | None:
    budget = Budget("refunds", limit=limit)
    return charges_json([charge_of(budget, {}, session_id="s", principal=None, tool_name="x")])


def test_an_edited_approval_says_who_what_changed_and_the_audit_logs_digest() -> None:
    """S13.6.5 with S13.3.3: the edit is an entry of its own, after the decision it is one
    with; values under the display rule (the call keeps them `***`)."""
    edit = ApprovalEdit(
        "alice", 102.0, {"amount": 500, "card": "***"}, {"amount": 300, "card": "***"}
    )
    approved = ApprovalDecision("approved", "alice", 102.0, None)
    call = _call(approval_deadline=200.0, approval=approved, approval_edit=edit)
    entries = [e for e in assemble(replace(FACTS, calls=(call,))) if e.call_key]
    kinds = [e.kind for e in entries]
    assert kinds[:4] == [
        EntryKind.CALL_REQUESTED,
        EntryKind.APPROVAL_ASKED,
        EntryKind.APPROVAL_DECIDED,
        EntryKind.APPROVAL_EDITED,
    ]
    assert entries[0].text == '{"amount": 500, "card": "***"}'  # as requested
    edited = entries[3]
    assert (edited.at, edited.actor, edited.state) == (102.0, "alice", "edited")
    assert "edited by alice when approving (changed: amount)" in edited.summary
    # The digest the audit log's `approval_edited` entry holds (docs/audit.md), shortened.
    assert digest(call.arguments)[:16] in edited.summary  # type: ignore[index]
    assert edited.text == '{"amount": 500, "card": "***"} -> {"amount": 300, "card": "***"}'


@pytest.mark.parametrize(
    ("status", "settled"),
    [
        (CallStatus.SUCCEEDED, "spent"),
        (CallStatus.FAILED, "released"),
        (CallStatus.OUTCOME_UNKNOWN, "held"),
    ],
)
def test_a_budgeted_call_shows_its_charge_reserved_then_settled(
    status: CallStatus, settled: str
) -> None:
    call = _call(status=status, budgets=_refunds())
    budget = [e for e in assemble(replace(FACTS, calls=(call,))) if "budget" in e.kind.value]
    assert [(e.kind, e.at, e.state) for e in budget] == [
        (EntryKind.BUDGET_CHARGED, 101.0, "reserved"),
        (EntryKind.BUDGET_SETTLED, 105.0, settled),
    ]
    assert "charged 1 to budget refunds (session:s, limit 2)" in budget[0].summary


def test_a_call_over_budget_is_charged_only_once_a_person_admits_it() -> None:
    """S13.1.4: over the budget, it waits; rejected, nothing was reserved; approved, its
    charge is reserved at the approval and settled at its end."""
    over = dict(budgets=_refunds(1), budget_reason="1 of 1 refunds in this session already used")
    rejected = _call(
        key="s/t/no",
        status=CallStatus.REJECTED,
        approval=ApprovalDecision("rejected", "bob", 103.0, None),
        **over,
    )
    approved = _call(approval=ApprovalDecision("approved", "ann", 103.0, None), **over)
    facts = replace(FACTS, calls=(rejected, approved))
    budget = [
        (e.call_name, e.kind, e.at, e.state) for e in assemble(facts) if "budget" in e.kind.value
    ]
    assert budget == [
        ("t/c", EntryKind.BUDGET_OVER, 101.0, "awaiting_approval"),
        ("t/no", EntryKind.BUDGET_OVER, 101.0, "rejected"),
        ("t/c", EntryKind.BUDGET_CHARGED, 103.0, "reserved"),
        ("t/c", EntryKind.BUDGET_SETTLED, 105.0, "spent"),
    ]
    charged = next(e for e in assemble(facts) if e.kind is EntryKind.BUDGET_CHARGED)
    assert "admitted over the budget by ann" in charged.summary
