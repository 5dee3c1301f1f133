"""One session with something of every kind in it, made by a real prefork worker: the session
the timeline tests (`sessions show`, the web app's session page) read (docs/operations.md,
"The session timeline").

In order: a user and an assistant message; a read that succeeds; a read with a secret argument;
a write a person approves (it then runs); a write a person approves with edited arguments
(S13.3.3); a write whose approval deadline passes; a write held by a write freeze at its claim,
then let run by the thaw (S13.2); a write drawing on a write budget (S13.1) whose worker is
SIGKILLed mid-run (`outcome_unknown`, its charge held), reconciled by its outcome check, which
sends the session the real outcome and says it went through (the charge spent).

The tests that read it run with `STORY_ENV` (the budget) in their environment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex, MessageRole, WentThrough, reconcile_once

#: A session id with spaces and non-ASCII letters (all valid, `model/ids.py`): the CLI takes it
#: as typed, the web app's path percent-encodes it.
SESSION = "Köln · order 1002 Ω"
SECRET = "tok-5f1e-very-secret"
USER_TEXT = "Please refund order 1002, it arrived broken."
ASSISTANT_TEXT = "I will look the order up, then ask for the refund."
NOTE = "refund agreed with the customer"
REPORT = "Note from the order desk: the refund of order 1002 went through."
FREEZE_REASON = "incident 42: the card processor double-charges"
#: The write budget the killed write draws on: two refunds per session.
STORY_ENV = {"DEX_BUDGETS": "refunds: tools=slow_non_idempotent_write limit=2 label=refunds"}
#: What the killed write's timeline tells, in order, leaving out its TOOL message (written with
#: the outcome, at its end or, by the sweeper, a little after it): charged to the budget, lost,
#: outcome_unknown (its charge held), surfaced, then the report, which says it went through (spent).
UNKNOWN_KINDS = [
    "call_requested",
    "budget_charged",
    "attempt_claimed",
    "attempt_ended",
    "call_ended",
    "budget_settled",
    "outcome_surfaced",
    "budget_settled",
    "report",
]


@dataclass(frozen=True)
class Story:
    """The keys of the session's calls, by what happened to them."""

    read: str
    secret: str
    approved: str
    edited: str
    expired: str
    frozen: str
    unknown: str


def make_story(dex: Dex, start_worker: Callable[..., Worker]) -> Story:
    """The session, on a real prefork worker (the test's sweeper must run: it expires the
    approval and records the killed attempt)."""
    worker = start_worker()
    client = dex.client()
    client.open_session(SESSION)
    client.add_message(SESSION, MessageRole.USER, USER_TEXT)
    client.add_message(SESSION, MessageRole.ASSISTANT, ASSISTANT_TEXT)
    read = client.request_call(SESSION, "t1", "look-up", "echo", {"order": "1002"}).key
    secret = client.request_call(
        SESSION, "t1", "auth", "with_secret", {"query": "orders", "api_token": SECRET}
    ).key
    approved = client.request_call(SESSION, "t2", "refund", "guarded_write", {"value": 1002}).key
    client.approve(approved, "alice", NOTE)
    edited = client.request_call(SESSION, "t2", "refund-fee", "guarded_write", {"value": 15}).key
    client.approve(edited, "alice", edit={"value": 5})
    expired = client.request_call(SESSION, "t2", "late", "guarded_write_short", {"value": 7}).key
    client.wait([read, secret, approved, edited], timeout=60)
    wait_for(
        lambda: client.get_call(expired).approval is not None,
        timeout=30,
        what="the short approval deadline to pass",
    )
    dex.writes.freeze(reason=FREEZE_REASON, by="ann")
    frozen = client.request_call(
        SESSION, "t3", "restock", "slow_idempotent_write", {"seconds": 0.05, "value": 1002}
    ).key
    wait_for(
        lambda: client.get_call(frozen).status is CallStatus.AWAITING_APPROVAL,
        timeout=30,
        what="the write to be held at its claim",
    )
    # The hold committed while the freeze was in force, so the thaw, and only the thaw, lets it
    # run (store/freezes.py `hold`): its report names it.
    assert dex.writes.thaw(by="bob").released == (frozen,)
    assert client.wait([frozen], timeout=60)[0].status is CallStatus.SUCCEEDED
    unknown = client.request_call(
        SESSION, "t4", "refund-2", "slow_non_idempotent_write", {"seconds": 60, "value": 1002}
    ).key
    wait_for(lambda: executions(unknown), timeout=60, what="the write to start")
    worker.kill_all()
    wait_for(
        lambda: client.get_call(unknown).status is CallStatus.OUTCOME_UNKNOWN,
        timeout=60,
        what="outcome_unknown for the killed write",
    )
    dex.register_outcome_check(
        "slow_non_idempotent_write", lambda key, arguments: WentThrough(REPORT)
    )
    assert reconcile_once(dex).reported_keys == (unknown,)
    return Story(read, secret, approved, edited, expired, frozen, unknown)
